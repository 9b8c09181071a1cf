"""The chaos soak (``bench/soak.py``): node workers killed and restarted, the broker and the
store restarted, while tasks stream in; then every task's outcome is checked.

- ``app``: the Celery app the soak's node workers run (-A bench.chaos.app);
- ``runs``: the body's own record of every run (start, end, node, pid), on disk;
- ``chaos``: the driver that kills, restarts and takes services down, and its log;
- ``verdict``: the checks at the end (pure): right final state in the store and at the
  caller, duplicate runs explained by a kill, retries and re-awards counted.
"""
