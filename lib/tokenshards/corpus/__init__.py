"""The corpus, beneath every command that reads one (``tokenize``, ``train-bpe``, ``verify --deep``),
in the order data flows: ``inputs`` (where the parquet files come from) → ``plan`` (their footers
→ the partition plan) → ``read`` (one piece's rows on a worker, through ``footers``). ``gather``
runs the first two around the cluster's start."""
