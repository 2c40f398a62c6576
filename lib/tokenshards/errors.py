"""The one exception type a user sees: its message is the whole story, printed on one line."""


class UserError(Exception):
    """A mistake the user can fix (bad input, bad option, unreachable storage).

    The CLI prints ``str(error)`` on one line and exits 2; ``--debug`` shows the traceback.
    Raise it with ``from e`` so the cause survives for ``--debug``.
    """

    exit_code = 2


class InputError(UserError):
    """An input file (or its schema) is unusable; the message names the file."""


class OutputConflict(UserError):
    """OUT already holds a different run; the message says what differs."""


class InputChanged(UserError):
    """An input was replaced or rewritten after the run planned it: never skipped (it is not
    unreadable), the run stops before a partition mixes old and new content."""
