"""Output format v1, the contract with training code: its names, entries, manifest and bytes
(``v1``), and random access to a finished run's documents (``reader``)."""
