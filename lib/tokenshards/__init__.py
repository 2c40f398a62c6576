"""tokenshards: FineWeb-scale parquet text → exact token arrays, on a Dask cluster."""

__version__ = "0.1.0"

__all__ = ["TokenDataset"]


def __getattr__(name: str):
    # Lazy: ``import tokenshards`` stays cheap (no numpy/pyarrow/fsspec until a dataset is opened).
    if name == "TokenDataset":
        from .format.reader import TokenDataset

        return TokenDataset
    raise AttributeError(f"module 'tokenshards' has no attribute {name!r}")
