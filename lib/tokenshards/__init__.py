"""tokenshards: FineWeb-scale parquet text → exact token arrays, on a Dask cluster."""

__version__ = "0.1.0"
