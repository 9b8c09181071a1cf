"""The allocation-quality simulation's parts (``bench/quality.py`` is its entry point).

- ``federation``: the simulated nodes, their hidden true rates, the task types and the load;
- ``tasks``: the seeded task stream (common random numbers for every policy);
- ``sim``: the discrete-event state the store would hold, and the nodes' slots and queues;
- ``baselines``: FIFO, random, least-loaded and the oracles;
- ``auction``: a production auction (``select_candidates``, ``compute_bid``, ``decide``);
- ``proposals``: changes to the scoring, evaluated in the simulation only;
- ``policies``: the table of policies compared, and which ones the targets apply to;
- ``runner``: one seed of the comparison, or of the candidate-cap study;
- ``metrics``: what one run of one policy scores;
- ``report``: the tables and the targets;
- ``plots``: the PNGs (matplotlib, from the optional ``bench`` extra).
"""
