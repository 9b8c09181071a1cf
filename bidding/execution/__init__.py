"""An awarded attempt: its execution message, its life on the winning node (accepted, completed,
retried, failed), retries and fallbacks, the ledger and episodes it leaves, and Celery's canvas
around it."""
