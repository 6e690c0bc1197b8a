"""Reporting over runs: seed statistics (``stats``) and the standard pass@k figures (``figures``)."""
