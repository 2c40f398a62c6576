"""Which processes and files this process shares with another: a machine is more than its host
name. Containers often share one, and two of them on one kernel still have their own processes
and mounts. ``process_space`` names where a pid means one process (the lease's "is its process
gone?"), ``file_view`` where a path means one file (do the workers see the client's folder?)."""
from __future__ import annotations

import functools
import os
import socket
import uuid


@functools.lru_cache(maxsize=1)
def _boot_id() -> str:
    """This kernel's boot: two machines never share it; containers on one kernel do."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return f"node-{uuid.getnode():012x}"  # not Linux: the network card's address


def _namespace(kind: str) -> str:
    """The inode of this process's ``kind`` namespace (Linux), "" elsewhere."""
    try:
        return str(os.stat(f"/proc/self/ns/{kind}").st_ino)
    except OSError:
        return ""


def process_space() -> str:
    """Where a pid names one process: host name, kernel boot and PID namespace."""
    return f"{socket.gethostname()}/{_boot_id()}/pid:{_namespace('pid')}"


def file_view() -> str:
    """Where a path names one file: kernel boot and mount namespace (the host name is for people)."""
    return f"{_boot_id()}/mnt:{_namespace('mnt')}"
