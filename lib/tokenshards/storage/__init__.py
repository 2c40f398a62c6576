"""The storage edge: fsspec I/O for local folders and s3:// (``store``), inputs given as paths and
globs (``sources``), and the Hugging Face Hub (``hubspec`` the request, ``hub`` the download)."""
