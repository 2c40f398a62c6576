"""``tokenshards tokenize``, in the order data flows: ``config`` → ``corpus`` (inputs, footers,
plan) → ``task`` (one partition on a worker: read, ``core`` tokenize, write, commit) → ``job``
(the run: resume, submit, manifest last)."""
