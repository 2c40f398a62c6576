"""The worker half of every tokenizer kind: built once per worker process by a named WorkerPlugin.

Workers never download or read a cache: the plugin carries the loaded tokenizer (tiktoken's
``TiktokenParams``, a ``tokenizer.json``'s text, a SentencePiece model's bytes) and builds its
encoder in ``setup``, or takes the one the local forkserver prebuilt (``prebuilt``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from distributed import WorkerPlugin, get_worker

from ..errors import UserError
from . import chat, prebuilt

if TYPE_CHECKING:
    import tiktoken


class EncoderPlugin(WorkerPlugin):
    """Builds the tokenizer (and its backend) once per worker process; tasks fetch them with
    ``worker_backend`` / ``worker_reference``. It carries what rebuilds the tokenizer (tiktoken's
    parameters, a ``tokenizer.json``'s text, a SentencePiece model's bytes), never a path.

    The name is fixed by the encoding's fingerprint and the backend, so a different encoding never
    collides with it; and it is idempotent: registering it again (a second run or ``verify --deep``
    on the same scheduler) leaves the running copy alone. Without that, distributed tears the old
    copy down and sets the new one up while tasks of the first run call ``worker_backend``.
    """

    idempotent = True

    def __init__(self, loaded, *, backend: str = "tiktoken"):
        self.name = plugin_name(loaded, backend=backend)
        self.fingerprint = loaded.fingerprint
        self.loaded = loaded
        self.backend_name = backend
        self.encoding: tiktoken.Encoding | None = None
        self.backend = None
        self.reference = None

    def setup(self, worker):
        found = prebuilt.for_worker(self.fingerprint, self.backend_name)  # a local worker's, verified already
        if found is not None:
            self.encoding, self.backend = found
            self.reference = getattr(self.backend, "reference", self.backend)
            return
        self.encoding = getattr(self.loaded, "encoding", None)
        try:
            self.backend = self.loaded.build(self.backend_name)
        except ImportError as e:  # the client has the backend, this machine does not
            reference = "tiktoken" if self.loaded.kind.startswith("tiktoken") else "reference"
            raise UserError(f"worker {worker.address} cannot load the {self.backend_name} backend ({e}); install "
                            f"tokenshards[fast] on every worker, or pass --backend {reference}") from e
        self.reference = getattr(self.backend, "reference", self.backend)

    @property
    def ref(self) -> WorkerEncoder:
        return WorkerEncoder(self.name)

    def __getstate__(self):
        return {"name": self.name, "fingerprint": self.fingerprint, "loaded": self.loaded,
                "backend_name": self.backend_name, "encoding": None, "backend": None, "reference": None}


@dataclass(frozen=True)
class WorkerEncoder:
    """How a task reaches what its worker's ``EncoderPlugin`` built: a name, small enough to
    travel in every task (the encoding itself is shipped once per worker, by the plugin)."""

    plugin: str

    def encoding(self) -> tiktoken.Encoding:
        return worker_encoding(self.plugin)

    def backend(self):
        return worker_backend(self.plugin)

    def reference(self):
        """The tokenizer's own library, as built in this worker (``verify --deep``'s judge)."""
        return _worker_plugin(self.plugin).reference

    def loaded(self):
        """The loaded tokenizer the plugin shipped (its files' bytes): what a chat run's template is built from."""
        return _worker_plugin(self.plugin).loaded

    def chat_template(self, template: str | None = None):
        """This worker's ``encoding.chat.ChatTemplate`` of the tokenizer (with ``template``, a run's
        ``--chat-template``, instead of the tokenizer's own), built on first use (loading
        transformers' tokenizer takes a second or more) and kept for every later task."""
        plugin = _worker_plugin(self.plugin)
        built = getattr(plugin, "chat", None)
        if built is None or built[0] != template:
            loaded = plugin.loaded
            plugin.chat = (template, chat.build(loaded.payload, loaded.extra, name=loaded.name, template=template))
        return plugin.chat[1]


def plugin_name(loaded, *, backend: str = "tiktoken") -> str:
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in loaded.name)[-48:]
    return f"tokenshards-encoder-{safe}-{loaded.fingerprint[:16]}-{backend}"


def _worker_plugin(name: str) -> EncoderPlugin:
    plugin = get_worker().plugins.get(name)
    if plugin is None or plugin.backend is None:
        raise RuntimeError(f"worker plugin {name!r} is not set up on this worker; register EncoderPlugin before computing")
    return plugin


def worker_encoding(name: str) -> tiktoken.Encoding:
    """The tiktoken encoding that ``EncoderPlugin`` built in this worker process."""
    return _worker_plugin(name).encoding


def worker_backend(name: str):
    """The tokenizer backend that ``EncoderPlugin`` built in this worker process."""
    return _worker_plugin(name).backend
