"""``tokenshards export``: format v1 → the files llm.c, modded-nanogpt, build-nanogpt, nanoGPT
and Megatron-LM read. Pure planning in ``valsplit``, ``layout``, ``formats``; worker I/O in
``write``; the Dask job in ``job``."""
from .job import DEFAULT_SHARD_TOKENS, DEFAULT_VAL_TOKENS, ExportConfig, ExportSummary, run_export

__all__ = ["DEFAULT_SHARD_TOKENS", "DEFAULT_VAL_TOKENS", "ExportConfig", "ExportSummary", "run_export"]
