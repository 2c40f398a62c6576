"""Output format v1, the contract with training code, one module per concern: the files' names
(``names``), which of them a reader may open (``paths``), the typed records and their one parser
(``records``), token arrays (``arrays``), docs tables (``docs``), the one reader of a run (``run``),
what a run writes (``v1``), random access to a finished run (``reader``) and the export record
(``export_record``)."""
