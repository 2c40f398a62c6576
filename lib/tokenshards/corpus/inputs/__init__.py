"""Where a job's parquet files come from, behind one small interface (``base.Inputs``):

- ``sources()``: every file, with the url tasks open it at (listed on the client, cheaply);
- ``set_up(client)``: once the cluster runs, what the workers need (a plugin) and what must be
  checked there (do they see this machine's folder? room on each machine's disk?);
- ``footers(client, request)``: each file's parquet metadata, on the workers for plain files,
  on the client by ranged GETs for Hub files not here yet, with the identity each file has
  (or will have) where tasks open it;
- ``arriving()`` / ``arrivals()``: which files are not whole yet, and each as it becomes whole
  (plain inputs: all are whole);
- ``lane_of(url)``: where a file's partitions should run (``--fetch workers``: its machine).

Implementations, one module each: ``plain`` (fsspec paths and URLs: local, s3://, hf://),
``hub_client`` (the Hub fetched by this process: first, or while tokenizing), ``hub_workers``
(the Hub fetched by the workers, each file by one machine: ``placement``), and ``choose``
(``open_inputs``: which one a run gets, ``--fetch auto`` included). ``corpus.gather`` plans
from any of them; ``tokenize`` and ``train-bpe`` go through it.
"""
from .base import FooterRequest, Inputs, Several
from .choose import open_inputs

__all__ = ["FooterRequest", "Inputs", "Several", "open_inputs"]
