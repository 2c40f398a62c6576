"""Imported first by the local workers' forkserver (``prestart.FIRST``), never elsewhere: the
server imports what the workers need with the garbage collector stopped (``prestart.pause_gc``);
``forkserver_preload``, imported last, starts it again."""
from .prestart import pause_gc

pause_gc()
