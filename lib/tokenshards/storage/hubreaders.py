"""What a reader after a run (``verify --deep``, ``inspect``) needs to open the inputs that a
``--fetch workers`` run recorded as ``hfcache://`` references."""
from __future__ import annotations

from .hubspec import PROTOCOL


def reading_plugins_for_run(identities: dict[str, dict], extra: dict, *, download_dir: str | None = None) -> list:
    """Read-only ``hfcache://`` plugins for a ``--fetch workers`` run's recorded inputs (their
    identities by path, ``Manifest.input_identities``, and the manifest's extra keys), for readers
    after the run (``verify --deep``, ``inspect``). A machine's copy is looked for in
    ``download_dir``, else in the ``--download-dir`` the run recorded, else in its HF cache; a file
    not there is read from the Hub by range. No plugin for any other run, and huggingface_hub not
    imported."""
    identities = {path: identity for path, identity in identities.items() if path.startswith(f"{PROTOCOL}://")}
    if not identities:
        return []
    # huggingface_hub (~0.1 s), imported only for a run that read the Hub through its workers.
    from .hub.workerfs import reading_plugins

    hub = extra.get("hub")
    recorded = hub.get("download_dir") if isinstance(hub, dict) else None
    return reading_plugins(identities, download_dir=download_dir or (recorded if isinstance(recorded, str) else None))
