"""The speed benchmark's markdown report, one module per section.

- ``header``: machine, versions, command, settings, skipped or failed backends;
- ``latency``: plain round trip against the auction, at each node count and bid mode;
- ``throughput``: bursts of plain tasks and of auctions;
- ``targets``: the speed targets this benchmark measures (latency, CPU, throughput, memory);
- ``timeline``: where an auction's time goes, from the store's timestamps;
- ``cpu``: CPU per task or auction, per process kind;
- ``startup``: node start-up and idle cost;
- ``profiles``: phase timers, pyinstrument and py-spy at the profiled node counts;
- ``modes``: reading the results of each bid mode at one node count.
"""

from __future__ import annotations

from typing import Any

from bench.speed.report.cpu import cpu_section
from bench.speed.report.header import header_section
from bench.speed.report.latency import latency_section
from bench.speed.report.profiles import profiles_section
from bench.speed.report.scale import scale_section
from bench.speed.report.startup import startup_section
from bench.speed.report.targets import targets_section
from bench.speed.report.throughput import throughput_section
from bench.speed.report.timeline import timeline_section


def render(results: dict[str, Any]) -> str:
    """The markdown report."""
    lines: list[str] = []
    for section in (header_section, latency_section, throughput_section, scale_section,
                    targets_section, timeline_section, cpu_section, startup_section,
                    profiles_section):
        lines += section(results)
    return "\n".join(lines)
