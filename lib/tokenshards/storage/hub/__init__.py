"""Hugging Face Hub inputs: ``--dataset REPO --size 10B`` → the parquet files of ``sample/10BT``.

Every request goes through huggingface_hub (``HfApi``, ``hf_hub_download``), so HF_ENDPOINT,
HF_TOKEN, HF_HOME/HF_HUB_CACHE and HF_HUB_OFFLINE mean what they mean to it. On top of it this
package adds what a batch job needs, one module per step:

- ``listing``: one pinned commit for the whole run, every file with its size and etag;
- ``retry``: retries of the transient errors huggingface_hub hands back to its caller;
- ``cache``: where a file goes on this machine, whether it is there whole, the disk check;
- ``fetch``: one file downloaded whole (with a size check against the listing);
- ``fetcher``: a sample downloaded by this process, all at once (``download``) or in the
  background while a job tokenizes (``Fetcher``, ``arrivals``), with its progress lines;
- ``footer``: a file's parquet footer by ranged GETs, and its identity once downloaded;
- ``workerfs``: ``hfcache://`` on the workers and the plugin that registers it (``--fetch workers``).

How a job uses them (which machine fetches, when a file's partitions start) is ``tokenshards.corpus.inputs``.
"""
from ..hubspec import FETCH_MODES, SAMPLE_DIR, HubDataset, folder_size, size_folder
from .cache import check_disk, free_bytes, is_present, local_path, local_sources, remember_revision
from .fetch import fetch_file
from .fetcher import OVERLAP_DOWNLOADS, Fetcher, arrivals, download, prepare_download
from .footer import FOOTER_TAIL, downloaded_identity, read_footer
from .listing import HubFile, HubListing, list_files
from .workerfs import PROTOCOL, HubCacheFileSystem, HubFetchPlugin, cache_uri, parse_cache_uri, reference_identity

__all__ = [
    "FETCH_MODES", "SAMPLE_DIR", "HubDataset", "folder_size", "size_folder",
    "check_disk", "free_bytes", "is_present", "local_path", "local_sources", "remember_revision",
    "fetch_file", "OVERLAP_DOWNLOADS", "Fetcher", "arrivals", "download", "prepare_download",
    "FOOTER_TAIL", "downloaded_identity", "read_footer", "HubFile", "HubListing", "list_files",
    "PROTOCOL", "HubCacheFileSystem", "HubFetchPlugin", "cache_uri", "parse_cache_uri", "reference_identity",
]
