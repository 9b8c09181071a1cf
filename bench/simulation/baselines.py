"""The baseline policies: FIFO, random, least-loaded, power-of-two-choices, and two oracles
that know the true rates.

"Capable" is the production candidate filter: the node has one of the required skills.
"""

from __future__ import annotations

from bench.simulation.federation import capable
from bench.simulation.sim import Sim
from bench.simulation.tasks import Task
from bidding.strategies.formulas import slot_share


def fifo(sim: Sim, task: Task, now: float) -> str | None:
    """The first free capable node in registration order, else the central queue, served by
    whichever capable node frees first."""
    for name in sim.present:
        spec = sim.specs[name]
        if capable(spec, task.skills) and sim.running[name] < spec.profile.capacity:
            return name
    sim.central.append(task)
    return None


def random_node(sim: Sim, task: Task, now: float) -> str | None:
    """Any capable node, at random."""
    return sim.rng.choice([n for n in sim.present if capable(sim.specs[n], task.skills)])


def least_loaded(sim: Sim, task: Task, now: float) -> str | None:
    """The capable node with the least work per slot; ties at random."""
    busy = {n: sim.in_flight(n) / sim.specs[n].profile.capacity
            for n in sim.present if capable(sim.specs[n], task.skills)}
    least = min(busy.values())
    return sim.rng.choice([n for n, b in busy.items() if b == least])


def power_of_two(sim: Sim, task: Task, now: float) -> str | None:
    """Power of two choices (Mitzenmacher; Sparrow's probes): two capable nodes drawn at
    random, the one with less work per slot; ties at random."""
    nodes = [n for n in sim.present if capable(sim.specs[n], task.skills)]
    pair = sim.rng.sample(nodes, 2) if len(nodes) > 1 else nodes
    busy = [sim.in_flight(n) / sim.specs[n].profile.capacity for n in pair]
    if len(pair) == 2 and busy[0] == busy[1]:
        return sim.rng.choice(pair)
    return pair[busy.index(min(busy))]


def oracle(sim: Sim, task: Task, now: float) -> str | None:
    """Knows the true rates: the highest true success probability, ties by load."""
    nodes = [n for n in sim.present if capable(sim.specs[n], task.skills)]
    return min(nodes, key=lambda n: (-sim.specs[n].p_true[task.task_type],
                                      sim.in_flight(n) / sim.specs[n].profile.capacity))


def oracle_free_slot(sim: Sim, task: Task, now: float) -> str | None:
    """Reference, not a target: knows the true rates but does not queue behind a full node when
    another capable node has a free slot (true probability x ``slot_share``, ties by load)."""
    nodes = [n for n in sim.present if capable(sim.specs[n], task.skills)]
    return max(nodes, key=lambda n: (
        sim.specs[n].p_true[task.task_type]
        * slot_share(sim.in_flight(n), sim.specs[n].profile.capacity),
        -sim.in_flight(n) / sim.specs[n].profile.capacity))
