"""Byte-level BPE training (``tokenshards train-bpe``): ``count`` (Dask job), ``merge`` (pure loop),
``ranks`` (the .tiktoken file, its JSON sidecar, the checks), ``train`` (the orchestration)."""
