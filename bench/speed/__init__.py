"""The speed benchmark's parts (``bench/latency.py`` is its entry point).

- ``options``: reading ``--nodes``, ``--bid-modes`` and the like;
- ``parent``: runs one child process per backend and collects their results;
- ``child``: one backend's run in its own process, written to a JSON file;
- ``backend``: the backend's broker, store, plain worker and node workers;
- ``run``: the whole run of a backend, and each node count (add nodes, measure each bid
  mode, burst, profile);
- ``measure``: round trips, auctions, bursts, CPU per task and idle cost;
- ``timeline``: an auction's phases, from the store's timestamps;
- ``trace``: the control file and snapshots of bench/phases.py's timers in the workers;
- ``profiling``: the two profile passes (phase timers and py-spy; pyinstrument);
- ``caller_profile``: pyinstrument on the caller, summarised;
- ``pyspy``: py-spy on two node workers, summarised;
- ``report``: the markdown report, one module per section.
"""
