"""Helpers shared by the benchmarks: one module per concept.

- ``paths``: where the bench/ folder and the repository root are;
- ``log``: progress lines on stderr;
- ``stats``: nearest-rank percentiles, summaries, mean ± sd;
- ``markdown``: table rows, rules and number cells;
- ``procstat``: CPU seconds and RSS of process trees, from /proc;
- ``processes``: stopping a process group that a benchmark started;
- ``machine``: what the numbers were measured on (CPU, memory, versions, commit, load);
- ``postgres``: a scratch PostgreSQL database, dropped afterwards;
- ``nodes``: node workers (flags, profile files, the ``Federation`` that runs them);
- ``plain_worker``: a plain Celery worker, the baseline of the speed benchmark.

None of them imports ``bidding`` at import time: ``bench/latency.py --source DIR`` must be able
to put another ``bidding`` first on ``sys.path`` after they are loaded.
"""
