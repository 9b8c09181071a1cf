"""What a process loads: ``import bidding`` nothing of its own, a node worker's main process
only what it uses (its memory: docs/architecture.md, "Known costs"), and every public name still
resolves, as a lazy attribute of the package.

Each check runs in a fresh interpreter: this process has imported everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import bidding
import bidding.observe.explain
import bidding.observe.status
from bidding.auction.unregistered import not_registered_on_a_node
from bidding.graphs import submit as submit_module

#: Heavy, optional packages that neither ``import bidding`` nor a node's main process loads
#: (each where it is used: the API, typed graphs, LLM bidders and judges, migrations, metrics;
#: Flower, Tornado and prompt_toolkit came with Celery's umbrella command).
NOT_LOADED = ("fastapi", "starlette", "uvicorn", "jsonschema", "pydantic_ai", "alembic",
              "prometheus_client", "flower", "tornado", "prompt_toolkit", "click_repl")


def run_fresh(script: str) -> Any:
    """Run ``script`` in a new interpreter and return the JSON it prints last."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def loaded(modules: list[str], packages: tuple[str, ...]) -> list[str]:
    """The modules of ``packages`` among ``modules``."""
    return sorted(m for m in modules if m.split(".")[0] in packages)


def test_import_bidding_loads_nothing_until_a_name_is_used() -> None:
    # given a fresh interpreter
    # when it imports the package, then uses names from it
    found = run_fresh("""
        import json, sys
        import bidding
        before = sorted(sys.modules)
        from bidding import explain, submit
        names = [type(getattr(bidding, name)).__name__ for name in bidding.__all__]
        print(json.dumps({"before": before, "explain": explain.__module__,
                          "submit": submit.__module__, "names": names}))
    """)
    # then the import alone loaded none of bidding's modules, nor Celery or anything optional
    assert [m for m in found["before"] if m.startswith("bidding.")] == []
    assert loaded(found["before"], ("celery", "sqlalchemy", "opentelemetry", "yaml",
                                    *NOT_LOADED)) == []
    # and each name resolved when used, to what its module defines
    assert (found["explain"], found["submit"]) == ("bidding.observe.explain",
                                                   "bidding.graphs.submit")
    assert len(found["names"]) == len(bidding.__all__)


def test_a_node_workers_main_process_loads_only_what_it_uses() -> None:
    # given a fresh interpreter without OpenTelemetry's SDK (with it, Redis's client imports
    # its metrics, and they its tracing API)
    # when it loads what `bidding worker` does: the command, an app with bidding installed and
    # a bidding task, Celery's worker command (asked for its help), and the tracing hooks
    found = run_fresh("""
        import contextlib, io, json, sys
        sys.modules["opentelemetry.sdk"] = None  # as if the otel extra were not installed
        from celery import Celery
        import bidding
        from bidding import tracing
        from bidding.cli import main
        from bidding.cli.celery_worker import run_worker

        app = Celery("lazy", broker="memory://", backend="cache+memory://")
        bidding.install(app)

        @app.task(base=bidding.BiddingTask, task_type="lazy")
        def lazy(): ...

        app.finalize()
        traced = tracing.enabled()
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown):
            code = run_worker(app, ["--help"], "bidding worker")
        print(json.dumps({"modules": sorted(sys.modules), "traced": traced, "code": code,
                          "help": shown.getvalue()}))
    """)
    modules = found["modules"]
    # then nothing optional is loaded: not the API, migrations, typed graphs or LLM agents,
    # nor Flower, Tornado or prompt_toolkit (Celery's umbrella command is not imported)
    assert loaded(modules, NOT_LOADED) == []
    assert "celery.bin.celery" not in modules
    # and tracing, with no provider set, did not import OpenTelemetry's tracing API (Redis's
    # client still imports its metrics API when installed: not ours to load or not)
    assert found["traced"] is False
    assert "opentelemetry.trace" not in modules
    # while Celery's worker command runs with the app's own worker option, as before
    assert found["code"] == 0
    assert "Usage: bidding worker" in found["help"]
    assert "--bidding-profile" in found["help"]


def test_install_connects_the_receiver_of_executions_a_node_cannot_run() -> None:
    # given a fresh interpreter whose app has bidding installed and no bidding task
    # when Celery reports an unknown task
    found = run_fresh("""
        import json, sys
        from celery import Celery
        from celery.signals import task_unknown
        import bidding
        bidding.install(Celery("plain", broker="memory://"))
        answered = task_unknown.send(sender=None, message=None, name="x", id="")
        print(json.dumps({"receivers": [f"{r.__module__}.{r.__name__}" for r, _ in answered],
                          "task": "bidding.task" in sys.modules}))
    """)
    # then bidding's receiver hears it (without bidding.task imported)
    assert "bidding.auction.unregistered.not_registered_on_a_node" in found["receivers"]
    assert found["task"] is False


def test_each_public_name_is_what_its_module_defines() -> None:
    # given the package's public names
    # when they are read from the package
    # then each is its module's own object, and a submodule is still an attribute
    assert bidding.explain is bidding.observe.explain.explain
    assert bidding.submit is submit_module.submit
    assert bidding.status is bidding.observe.status
    assert set(bidding.__all__) <= set(dir(bidding))
    assert bidding.config.Settings is bidding.Settings
    assert not_registered_on_a_node.__module__ == "bidding.auction.unregistered"


def test_an_unknown_name_is_an_attribute_error() -> None:
    # given the package
    # when a name it does not have is read, then it is an AttributeError naming it
    try:
        bidding.no_such_name  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("bidding.no_such_name resolved")
