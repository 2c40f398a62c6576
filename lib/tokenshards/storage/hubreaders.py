"""What a reader after a run (``verify --deep``, ``inspect``) needs to open the inputs that a
``--fetch workers`` run recorded as ``hfcache://`` references."""
from __future__ import annotations

from .hubspec import PROTOCOL


def reading_plugins_for_run(inputs: list, extra: dict, *, paths: set[str] | None = None,
                            download_dir: str | None = None) -> list:
    """Read-only ``hfcache://`` plugins for a ``--fetch workers`` run's recorded inputs (a
    manifest's ``inputs`` and its extra keys; ``paths``: only those inputs), for readers after
    the run (``verify --deep``, ``inspect``). A machine's copy is looked for in ``download_dir``,
    else in the ``--download-dir`` the run recorded, else in its HF cache; a file not there is
    read from the Hub by range. No plugin for any other run, and huggingface_hub not imported."""
    identities = {i["path"]: i["identity"] for i in inputs
                  if isinstance(i, dict) and str(i.get("path", "")).startswith(f"{PROTOCOL}://")
                  and (paths is None or i["path"] in paths) and isinstance(i.get("identity"), dict)}
    if not identities:
        return []
    # huggingface_hub (~0.1 s), imported only for a run that read the Hub through its workers.
    from .hub.workerfs import reading_plugins

    hub = extra.get("hub")
    recorded = hub.get("download_dir") if isinstance(hub, dict) else None
    return reading_plugins(identities, download_dir=download_dir or (recorded if isinstance(recorded, str) else None))
