"""``tokenshards export``: format v1 → the files training code reads (``formats/``: one module
per format, in one registry). Pure planning in ``config``, ``valsplit``, ``layout``, ``order``,
``mix`` and ``formats``; worker I/O in ``view`` (a piece of a split's stream) and ``write``
(rendering and putting chunks); the drivers ``command`` (entry, manifest order) and ``shuffle``
(seeded, mixed), both standing on ``common``."""
__all__ = ["DEFAULT_SHARD_TOKENS", "DEFAULT_VAL_TOKENS", "ExportConfig", "ExportSummary", "run_export"]


def __getattr__(name: str):
    """Lazily, so that the CLI can build ``--format``'s choices from ``formats`` without importing Dask."""
    if name in __all__:
        from . import command

        return getattr(command, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
