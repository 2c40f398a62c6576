"""``tokenshards tokenize``, in the order data flows: ``config`` → the corpus (``corpus.gather``:
inputs, footers, plan) → ``task`` (one partition on a worker: ``corpus.read``, ``core`` tokenize,
write, commit) → ``resume`` (what of OUT this job may keep) → ``job`` (the run: submit, manifest
last). The format itself is ``format.v1``."""
