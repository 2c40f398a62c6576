"""``tokenshards tokenize``, in the order data flows: ``config`` → ``corpus`` (inputs, footers,
plan) → ``task`` (one partition on a worker: read, ``core`` tokenize, write, commit) → ``resume``
(what of OUT this job may keep) → ``job`` (the run: submit, manifest last). The format itself is
``format.v1``."""
