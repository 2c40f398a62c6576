"""The one exception type a user sees: its message is the whole story, printed on one line."""
from __future__ import annotations

from .wording import scrub


class UserError(Exception):
    """A mistake the user can fix (bad input, bad option, unreachable storage).

    The CLI prints ``str(error)`` on one line and exits 2; ``--debug`` shows the traceback.
    Raise it with ``from e`` so the cause survives for ``--debug``.
    """

    exit_code = 2

    def __init__(self, *args: object):
        # Every message a user sees is worded here: no credential survives into it, whatever the
        # cause quoted (a URL with a token in its query, a connection string, a key).
        super().__init__(*(scrub(a) if isinstance(a, str) else a for a in args))


class InputError(UserError):
    """An input file (or its schema) is unusable; the message names the file."""

    @property
    def reason(self) -> str:
        """What ``--on-bad-file skip`` records and says of the file it leaves out."""
        return str(self)


class UnreadableInput(InputError):
    """An input, or some of its row groups, that cannot be read: ``--on-bad-file skip`` would
    leave it out, and the message says so after what to do about it (``fix``). Under skip the
    ``reason`` is said and recorded without that advice: never suggest the flag already given."""

    def __init__(self, reason: str, fix: str):
        super().__init__(reason, fix)  # both in args: the error pickles from a worker to the client

    @property
    def reason(self) -> str:
        return self.args[0]

    def __str__(self) -> str:
        return f"{self.args[0]}; {self.args[1]}, or pass --on-bad-file skip"


class OutputConflict(UserError):
    """OUT already holds a different run; the message says what differs."""


class InputChanged(UserError):
    """An input was replaced or rewritten after the run planned it: never skipped (it is not
    unreadable), the run stops before a partition mixes old and new content."""
