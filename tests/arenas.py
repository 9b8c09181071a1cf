"""How many malloc arenas a process's threads end up with (glibc's ``malloc_info``), for the
tests of ``bidding.nodes.arenas``: in a process of the unit tests' own, and in a node worker's
pool process."""

from __future__ import annotations

import ctypes
import threading


def arenas_after_threads(threads: int = 8) -> int:
    """Start ``threads`` threads that each allocate and stay alive together, then count this
    process's arenas (a ``<heap>`` in glibc's ``malloc_info``)."""
    libc = ctypes.CDLL(None)
    libc.open_memstream.restype = ctypes.c_void_p
    together = threading.Barrier(threads + 1)
    kept: list[bytearray] = []

    def work() -> None:
        kept.append(bytearray(200_000))
        together.wait()
        together.wait()

    started = [threading.Thread(target=work) for _ in range(threads)]
    for thread in started:
        thread.start()
    together.wait()
    try:
        buffer, size = ctypes.c_void_p(), ctypes.c_size_t()
        stream = ctypes.c_void_p(libc.open_memstream(ctypes.byref(buffer), ctypes.byref(size)))
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        text = ctypes.string_at(buffer.value or 0, size.value)
        libc.free(buffer)
        return text.count(b"<heap nr=")
    finally:
        together.wait()
        for thread in started:
            thread.join()
