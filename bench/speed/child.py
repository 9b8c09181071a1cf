"""One backend's run in a child process of its own, its results written to ``--json``.

A process of its own, so that the app is configured from a clean environment and the
benchmarked ``bidding`` (``--source``) is the only one this process imports.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import bench
from bench.common.log import log
from bench.common.paths import ROOT
from bench.speed.backend import SkipBackend
from bench.speed.run import run_backend


def _source_first(source: Path) -> None:
    """Put ``source`` (then this repository) first on sys.path, so that ``import bidding``
    loads the benchmarked one; and ``source``'s own bench/app.py and bench/phases.py, if it
    has them, first among the ``bench`` modules not loaded yet (the workers, started in
    ``source``, load those: the caller must time the same functions)."""
    for path in reversed(list(dict.fromkeys([str(source), str(ROOT)]))):
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
    own = source / "bench"
    if source != ROOT and (own / "app.py").is_file():
        bench.__path__.insert(0, str(own))


def child_main(args: argparse.Namespace) -> int:
    """Run one backend and write its results to ``args.json``."""
    _source_first(Path(args.source).absolute())

    def terminate(signum: int, _frame: Any) -> None:
        # SystemExit unwinds the backend's ExitStack: every worker it started is stopped.
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    res: dict[str, Any] = {"backend": args.backend}
    code = 0
    t0 = time.monotonic()
    try:
        run_backend(args, res)
    except SkipBackend as exc:
        res["skipped"] = str(exc)
        log(f"{args.backend}: skipped: {exc}")
    except (KeyboardInterrupt, SystemExit) as exc:
        res["error"] = f"interrupted ({type(exc).__name__} {exc})"
        log(f"{args.backend}: interrupted; stopping every worker")
        code = 1
    except BaseException as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
        code = 1
    finally:
        res["runtime_s"] = time.monotonic() - t0
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    return code
