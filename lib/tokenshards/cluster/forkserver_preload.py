"""Imported last by the local workers' forkserver (``prestart.LAST``), never elsewhere: it
answers once what every worker's handshake asks (``host_versions``), then ends the pause
``forkserver_begin`` started (``prestart.resume_gc``): the server's heap, with whatever the caller's
preload built in it (``ForkserverPreload``), is frozen, so the workers' garbage collector never
walks (and so never copies) the pages they share with the server, and runs again for the rest."""
from distributed.versions import get_versions

from .prestart import resume_gc


def host_versions() -> None:
    """Each worker sends the scheduler ``get_versions()`` when it starts: ``platform.uname()``'s
    processor runs ``uname -p`` as a subprocess, and the package versions are read from their
    metadata, ~8 ms of CPU (11 ms wall) per process measured here, while both cores are busy
    starting. Both are cached per process (``platform``'s uname, distributed's
    ``_version_cached``), so asked once here, every worker forked from this server inherits them."""
    get_versions()


try:
    host_versions()
finally:
    resume_gc()
