"""Imported last by the local workers' forkserver (``prestart.PRELOAD``), never elsewhere: it
prebuilds the encoder the command asked for and freezes the server's heap (``encoding/prebuilt.py``)."""
from ..encoding import prebuilt

prebuilt.build_requested()
