"""A node worker's malloc arenas (``bidding.nodes.arenas``): capped before its threads start,
so that each thread does not keep an arena of its own; ``MALLOC_ARENA_MAX`` and 0 leave glibc
as it is. Each case runs in a process of its own (a cap cannot be lifted once set)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bidding.nodes.arenas import glibc

pytestmark = pytest.mark.skipif(not glibc(), reason="malloc arenas are glibc's")

ROOT = Path(__file__).resolve().parents[2]
#: Caps (or not) the arenas as a node worker does, then prints whether it did and how many
#: arenas eight threads that allocate at once end up with.
PROGRAM = """
import sys
from bidding.nodes.arenas import limit_arenas
from tests.arenas import arenas_after_threads

print(limit_arenas(int(sys.argv[1])), arenas_after_threads(8))
"""


def arenas_of(cap: int, environ: dict[str, str] | None = None) -> tuple[bool, int]:
    """(whether the cap was set, how many arenas eight live threads ended up with)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_ARENA_MAX", "GLIBC_TUNABLES")}
    out = subprocess.run([sys.executable, "-c", PROGRAM, str(cap)], env={**env, **(environ or {})},
                         cwd=ROOT, capture_output=True, text=True, timeout=60,
                         check=True).stdout.split()
    return out[0] == "True", int(out[1])


def test_a_capped_process_keeps_its_threads_to_two_arenas() -> None:
    # given a process that caps its arenas at two, as a node worker does by default
    # when eight threads allocate at once
    capped, arenas = arenas_of(2)
    # then they share two arenas
    assert capped
    assert arenas <= 2


def test_without_the_cap_each_thread_gets_an_arena_of_its_own() -> None:
    # given bidding_malloc_arenas = 0 (glibc's default: up to eight arenas per core)
    # when eight threads allocate at once
    capped, arenas = arenas_of(0)
    # then nothing was capped, and the threads have arenas of their own
    assert not capped
    assert arenas > 2


def test_malloc_arena_max_in_the_environment_is_left_as_the_operator_set_it() -> None:
    # given MALLOC_ARENA_MAX=4 in the environment (glibc's own knob)
    # when the node's cap of two would apply
    capped, arenas = arenas_of(2, {"MALLOC_ARENA_MAX": "4"})
    # then the operator's four stands
    assert not capped
    assert 2 < arenas <= 4


def test_an_arena_limit_among_glibcs_tunables_is_left_as_set() -> None:
    # given glibc.malloc.arena_max=4 among GLIBC_TUNABLES (glibc's newer knob)
    # when the node's cap of two would apply
    capped, arenas = arenas_of(2, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"})
    # then the tunable's four stands
    assert not capped
    assert 2 < arenas <= 4
