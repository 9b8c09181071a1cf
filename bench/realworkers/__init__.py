"""FIFO against bidding on real workers: the parts (``bench/fifo_vs_bidding.py`` runs them).

- ``cluster``: an embedded Redis, a SQLite store and the four node workers of
  ``bench/fifo_app.py``, started and stopped;
- ``phase``: one policy's tasks, submitted at a steady rate, and their outcomes;
- ``summary``: success rates, expected rates and tasks per node of one phase;
- ``report``: the markdown report.
"""
