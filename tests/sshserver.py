"""A real SSH server on 127.0.0.1 for tests (asyncssh, in a thread): it runs each command it is
sent through the local shell, as sshd would, so distributed's SSHCluster starts its scheduler
and workers through it unchanged. Key authentication only; every process it started is killed
when the client disconnects or the server stops."""
from __future__ import annotations

import asyncio
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

import asyncssh


@dataclass
class SSHServer:
    port: int
    client_key: str
    """Path of the private key the client logs in with."""

    def connect_options(self) -> dict:
        return {"port": self.port, "username": "tokenshards", "client_keys": [self.client_key], "known_hosts": None}


class _Server(asyncssh.SSHServer):
    def __init__(self, pids: set[int], registry: dict):
        self.pids = pids
        self.registry = registry
        self.mine: set[int] = set()

    def connection_made(self, conn):
        self.registry[conn] = self

    def connection_lost(self, exc):
        for pid in self.mine:
            _kill_group(pid)
        self.pids -= self.mine


class _Relay(asyncio.SubprocessProtocol):
    """Copies a local process's stdout/stderr to the SSH channel."""

    def __init__(self, process: asyncssh.SSHServerProcess):
        self.process = process
        self.done = asyncio.get_running_loop().create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        try:
            (self.process.stdout if fd == 1 else self.process.stderr).write(data)
        except (OSError, asyncssh.Error):
            pass  # the client went away; the process is killed with its group

    def connection_lost(self, exc) -> None:
        """Called once the process exited and both pipes closed."""
        if not self.done.done():
            self.done.set_result(None)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def start_ssh_server(folder: Path):
    """Start the server; returns (SSHServer, stop function)."""
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    key_path = folder / "client_key"
    client_key.write_private_key(str(key_path))
    authorized = asyncssh.import_authorized_keys(client_key.export_public_key().decode())
    pids: set[int] = set()
    registry: dict = {}
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict = {}

    def factory():
        return _Server(pids, registry)

    async def run_command(process: asyncssh.SSHServerProcess) -> None:
        """Like sshd: the command runs in the shell; its output goes back over the channel."""
        server = registry.get(process.get_extra_info("connection"))
        transport, relay = await asyncio.get_running_loop().subprocess_shell(
            lambda: _Relay(process), process.command or "true", stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
        pid = transport.get_pid()
        pids.add(pid)
        if server is not None:
            server.mine.add(pid)
        try:
            await relay.done
            process.exit(transport.get_returncode())
        finally:
            _kill_group(pid)
            # Let asyncio reap it first: closing the transport of a process still running leaves a
            # Popen that warns "subprocess ... is still running" when collected (an error under -W error).
            for _ in range(200):
                if transport.get_returncode() is not None:
                    break
                await asyncio.sleep(0.05)
            transport.close()
            await asyncio.wait([relay.done], timeout=10)
            pids.discard(pid)

    async def main():
        acceptor = await asyncssh.create_server(factory, "127.0.0.1", 0, server_host_keys=[host_key],
                                                authorized_client_keys=authorized, process_factory=run_command,
                                                encoding=None)
        state["acceptor"] = acceptor
        state["port"] = acceptor.sockets[0].getsockname()[1]
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(main()), loop.run_forever()), daemon=True)
    thread.start()
    ready.wait(30)

    def stop():
        async def close():
            for pid in list(pids):
                _kill_group(pid)
            state["acceptor"].close()
            await state["acceptor"].wait_closed()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()

    return SSHServer(port=state["port"], client_key=str(key_path)), stop
