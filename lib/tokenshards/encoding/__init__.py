"""Encodings: loading tiktoken's (and train-bpe's ``.tiktoken`` files, ``ranks``), the fast exact
backends verified against tiktoken (``backends``), and the worker plugin that builds them once."""
