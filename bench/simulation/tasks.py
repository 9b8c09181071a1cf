"""The seeded task stream: Poisson arrivals, types, contents and per-task random draws.

Common random numbers: every policy sees the same arrivals, contents and draws (a task
succeeds on node n when u_ok < p_true[n][type]), so differences come from the allocation only.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from bench.simulation.federation import LENGTH_BANDS, TASK_TYPES


@dataclass(frozen=True)
class Task:
    """One task: its type and skills, arrival time, content, and its random draws."""

    idx: int
    task_type: str
    skills: tuple[str, ...]
    arrival: float
    content: str
    p_factor: float
    dur_factor: float
    #: Common random numbers: success when u_ok < p; duration from z_dur.
    u_ok: float
    z_dur: float
    #: What one attempt holds while it runs (the announcement's ``resources``); none by default.
    needs: Mapping[str, float] = field(default_factory=dict)


def make_tasks(n: int, seed: int, rate: float) -> list[Task]:
    """``n`` tasks arriving at ``rate`` per second on average, drawn from ``seed``."""
    rng = random.Random(seed)
    types = list(TASK_TYPES)
    weights = [TASK_TYPES[t][1] for t in types]
    tasks = []
    now = 0.0
    for i in range(n):
        now += rng.expovariate(rate)
        task_type = rng.choices(types, weights)[0]
        band = rng.choices(LENGTH_BANDS, [b[0] for b in LENGTH_BANDS])[0]
        length = rng.randint(band[1], band[2])
        content = f'[["{task_type}"], {{"doc": "' + "x" * max(0, length - 30) + '"}]'
        tasks.append(Task(i, task_type, TASK_TYPES[task_type][0], now, content, band[3],
                          band[4], rng.random(), rng.gauss(0.0, 1.0)))
    return tasks
