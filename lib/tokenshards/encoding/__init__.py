"""Encodings: loading tiktoken's (and train-bpe's ``.tiktoken`` files, ``ranks``), the fast exact
backends verified against tiktoken (``backends``), the worker plugin that builds them once, and
the encoder local workers' forkserver builds for them before they exist (``prebuilt``)."""
