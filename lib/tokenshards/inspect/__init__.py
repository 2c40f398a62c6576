"""``tokenshards inspect``: totals, document-length percentiles and languages of a finished run."""
