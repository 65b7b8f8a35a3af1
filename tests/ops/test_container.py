"""The container files, checked without a Docker engine: hadolint on the Dockerfile, its
structure with dockerfile-parse (against the Makefile's setup target), and the compose
file's services, loopback-only ports, volumes and commands."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from config.environment import FLOWER_TELEMETRY_OFF, MLFLOW_SERVER_NO_JOBS
from fedsieve.cli import COMMANDS
from tests.limits import limit

REPO = Path(__file__).resolve().parents[2]
HADOLINT = Path(sys.executable).parent / "hadolint"


def parse(build_args: dict[str, str] | None = None) -> DockerfileParser:
    return DockerfileParser(
        fileobj=io.BytesIO((REPO / "Dockerfile").read_bytes()), build_args=build_args or {}
    )


def instructions(parser: DockerfileParser, name: str) -> list[dict[str, Any]]:
    return [i for i in parser.structure if i["instruction"] == name]


def make_recipe(target: str) -> list[str]:
    """A Makefile target's recipe, one command per line."""
    lines = (REPO / "Makefile").read_text().splitlines()
    start = next(n for n, line in enumerate(lines) if line.split(":")[0] == target) + 1
    recipe = []
    for line in lines[start:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe


@pytest.fixture(scope="module")
def dockerfile() -> DockerfileParser:
    return parse()


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def stages(parser: DockerfileParser) -> list[list[dict[str, Any]]]:
    """The Dockerfile's instructions, one list per stage (FROM first)."""
    out: list[list[dict[str, Any]]] = []
    for instruction in parser.structure:
        if instruction["instruction"] == "FROM":
            out.append([])
        if out:
            out[-1].append(instruction)
    return out


def of(stage: list[dict[str, Any]], name: str) -> list[str]:
    return [i["value"] for i in stage if i["instruction"] == name]


def assert_hadolint_clean(dockerfile: Path) -> None:
    done = subprocess.run(
        [str(HADOLINT), "--failure-threshold", "warning", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=limit(60),
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_finds_nothing_at_warning_level():
    assert_hadolint_clean(REPO / "Dockerfile")


def test_two_stages_from_python_slim_and_the_variant_checked_before_anything_else(dockerfile):
    build, runtime = stages(dockerfile)
    assert of(build, "FROM") == ["python:3.11-slim AS build"]
    assert of(runtime, "FROM") == ["python:3.11-slim"]
    first_run = of(build, "RUN")[0]
    assert "TORCH_VARIANT must be cpu or cuda" in first_run and "exit 1" in first_run
    args = [i["value"] for i in instructions(dockerfile, "ARG")]
    assert args[0] == "TORCH_VARIANT=cpu"  # the global default both stages read


def test_dependencies_install_before_the_source_with_the_makefiles_own_steps(dockerfile):
    build, _ = stages(dockerfile)
    steps = [(i["instruction"], i["value"]) for i in build if i["instruction"] in ("COPY", "RUN")]
    copies = [n for n, (kind, _) in enumerate(steps) if kind == "COPY"]
    deps = next(n for n, (kind, v) in enumerate(steps) if kind == "RUN" and "make deps" in v)
    assert steps[copies[0]][1] == "Makefile pyproject.toml ./"  # what the dependencies need
    # the project's editable install too: it needs only pyproject.toml, so the
    # environment's layers outlive source edits
    assert "make deps project" in steps[deps][1]
    assert copies[0] < deps < copies[1] and steps[copies[1]][1] == ". ."
    runs = [i["value"] for i in instructions(dockerfile, "RUN")]
    assert not any("pip install" in run for run in runs), "install steps must not diverge"
    # the CPU image refuses a torch built for CUDA (a fallback from an unreachable index)
    assert "torch.version.cuda" in steps[deps][1] and "PIP_EXTRA_INDEX_URL" in steps[deps][1]
    recipe = make_recipe("setup")
    # the image's steps, both environments; the dev tools only in `make setup`'s, resolved
    # with the pinned stack (the image's `make deps` installs the hub's extras alone)
    assert "deps setup-flower browser" in recipe[0] and recipe[0].endswith('EXTRAS="hub dev"')
    assert "EXTRAS ?= hub" in (REPO / "Makefile").read_text().splitlines()
    assert any('-e ".[hub,dev]"' in line for line in recipe)
    deps_recipe = make_recipe("deps")
    assert "torch==2.13.0" in deps_recipe[1] and "requirements.txt" in deps_recipe[3]
    assert "--no-deps medmnist==3.0.2" in deps_recipe[4]
    assert any("--no-deps" in line and "-e ." in line for line in make_recipe("project"))
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv", "mlflow.db", ".prefect", "tracking"} <= set(ignored)
    assert {"certs", "keys", "plan.json", "federation"} <= set(ignored)  # ca.key, site keys
    assert not {"Makefile", "pyproject.toml", "params.yaml"} & set(ignored)


def test_the_runtime_stage_has_no_build_or_dev_tools_and_runs_as_non_root(dockerfile):
    _, runtime = stages(dockerfile)
    assert not any("make" in run.split() for run in of(runtime, "RUN"))
    assert of(runtime, "COPY") == [  # the environments, then the source: a layer each
        "--from=build --chown=10001:10001 /app/.venv /app/.venv",
        "--from=build --chown=10001:10001 /app/.venv-flower-cli /app/.venv-flower-cli",
        "--from=build --chown=10001:10001 /source /app",
    ]
    users = of(runtime, "USER")
    assert users and users[-1].split(":")[0] not in ("root", "0")
    [entrypoint] = instructions(dockerfile, "ENTRYPOINT")
    [cmd] = instructions(dockerfile, "CMD")
    assert json.loads(entrypoint["value"]) == ["fedsieve"]
    assert json.loads(cmd["value"]) == ["run"] and "run" in COMMANDS
    [healthcheck] = instructions(dockerfile, "HEALTHCHECK")
    assert "FEDSIEVE_HEALTH_URL" in healthcheck["value"]
    env = dockerfile.envs
    assert env["DO_NOT_TRACK"] == "true" and env["MLFLOW_DISABLE_TELEMETRY"] == "true"
    assert env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    assert {key: env.get(key) for key in FLOWER_TELEMETRY_OFF} == FLOWER_TELEMETRY_OFF  # flwr CLI
    assert env["PATH"].startswith("/app/.venv/bin")
    assert env["GIT_PYTHON_REFRESH"] == "quiet"  # MLflow's documented switch: no git, no noise


def test_the_image_keeps_data_results_and_tracking_in_volumes(dockerfile):
    [volume] = instructions(dockerfile, "VOLUME")
    assert set(json.loads(volume["value"])) == {
        "/app/data",
        "/app/reports",
        "/app/artifacts",
        "/app/tracking",
    }
    assert dockerfile.envs["MLFLOW_TRACKING_URI"] == "sqlite:////app/tracking/mlflow.db"
    readme = (REPO / "README.md").read_text()
    assert all(f":/app/{name}" in readme for name in ("data", "reports", "artifacts", "tracking"))


def test_compose_has_the_servers_the_deployments_and_a_worker(compose):
    services = compose["services"]
    assert {"mlflow", "prefect-server", "deploy", "worker"} <= set(services)
    for name in ("mlflow", "prefect-server", "worker"):
        assert "healthcheck" in services[name] or "FEDSIEVE_HEALTH_URL" in str(
            services[name].get("environment")
        ), name
    for name in ("mlflow", "prefect-server"):
        assert services[name]["healthcheck"]["test"][0] == "CMD"


def test_compose_serves_the_champion_with_mlflows_own_server(compose):
    model = compose["services"]["model"]
    command = model["command"]

    assert model["entrypoint"] == ["mlflow"] and command[:2] == ["models", "serve"]
    assert command[command.index("-m") + 1].endswith("@champion")
    assert command[command.index("--env-manager") + 1] == "local"  # the image has fedsieve
    assert model["ports"] == ["127.0.0.1:5002:5002"]
    assert model["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert "/ping" in model["healthcheck"]["test"][-1]
    assert "FEDSIEVE_MODEL_READS_PATHS" not in model["environment"]  # paths refused: the default


def test_compose_publishes_ports_on_loopback_only(compose):
    published = [
        (name, port) for name, s in compose["services"].items() for port in s.get("ports", [])
    ]
    assert published, "the UIs should be reachable from the host"
    for name, port in published:
        assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def test_a_workers_health_server_listens_on_loopback_only(compose):
    # Prefect binds it to 0.0.0.0 by default; the health check asks 127.0.0.1 from inside
    for name in ("worker", "worker-gpu"):
        environment = compose["services"][name]["environment"]
        assert environment["PREFECT_WORKER_WEBSERVER_HOST"] == "127.0.0.1", name
        assert environment["FEDSIEVE_HEALTH_URL"].startswith("http://127.0.0.1:"), name


def test_the_postgresql_stand_in_stops_as_the_official_image_does():
    # a `docker stop` of the stand-in is PostgreSQL's fast shutdown (SIGINT), as postgres:16's
    # STOPSIGNAL: an outage that begins when the fault says, not 10 s of pooled connections
    standin = DockerfileParser(
        fileobj=io.BytesIO((REPO / "scripts" / "postgres-standin" / "Dockerfile").read_bytes())
    )
    [stop] = instructions(standin, "STOPSIGNAL")
    assert stop["value"] == "SIGINT"
    entrypoint = (REPO / "scripts" / "postgres-standin" / "entrypoint.sh").read_text()
    assert entrypoint.rstrip().splitlines()[-1].startswith('exec "$PGBIN/postgres"')  # gets it


def test_a_server_whose_database_is_away_shows_unhealthy_within_30_s(compose):
    # Docker marks a service unhealthy after `retries` consecutive failed probes, `interval`
    # apart, each taking at most `timeout`: the worst case from an outage's start
    def seconds(value: str) -> float:
        return float(value.removesuffix("s"))

    for name in ("mlflow", "prefect-server"):
        check = compose["services"][name]["healthcheck"]
        worst = check["retries"] * (seconds(check["interval"]) + seconds(check["timeout"]))
        assert worst <= 30, (name, check)
        assert check["retries"] >= 2, "one slow probe alone must not mark a live server unhealthy"


def test_compose_volumes_are_declared_and_hold_the_state(compose):
    declared = set(compose["volumes"])
    used = {
        volume.split(":")[0]
        for service in compose["services"].values()
        for volume in service.get("volumes", [])
        if not volume.startswith("./")  # a file of the checkout, mounted read-only
    }
    assert used <= declared
    mounts = {
        name: [v.split(":")[1] for v in s.get("volumes", [])]
        for name, s in compose["services"].items()
    }
    assert "/srv/mlflow" in mounts["mlflow"] and "/srv/prefect" in mounts["prefect-server"]
    assert "/var/lib/postgresql/data" in mounts["postgres"]


def test_the_compose_mlflow_server_runs_without_mlflows_job_runner(compose):
    """The switch itself is exercised on loopback (tests/ops/test_tracking_failure.py)."""
    environment = compose["services"]["mlflow"]["environment"]
    assert {key: environment.get(key) for key in MLFLOW_SERVER_NO_JOBS} == MLFLOW_SERVER_NO_JOBS


def test_both_servers_store_their_state_in_one_postgresql_with_a_database_each(compose):
    services = compose["services"]
    postgres = services["postgres"]
    assert postgres["image"].startswith("postgres:") and "ports" not in postgres
    assert postgres["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    first = postgres["environment"]["POSTGRES_DB"]
    init = next(v for v in postgres["volumes"] if "docker-entrypoint-initdb.d" in v)
    second = re.findall(r"CREATE DATABASE (\w+)", (REPO / init.split(":")[0]).read_text())
    mlflow_store = next(
        a for a in services["mlflow"]["command"] if a.startswith("--backend-store-uri=")
    )
    prefect_store = services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert mlflow_store.startswith("--backend-store-uri=postgresql://")
    assert mlflow_store.endswith(f"@postgres:5432/{first}")
    assert prefect_store.startswith("postgresql+asyncpg://")
    assert second == [prefect_store.rsplit("/", 1)[1]] and second != [first]
    for name in ("mlflow", "prefect-server"):
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "psycopg2-binary" in (REPO / "pyproject.toml").read_text()  # MLflow's driver


def test_the_stack_rides_out_a_database_outage_of_about_two_minutes(compose):
    """Each MLflow or Prefect call from a worker's run is retried for about two minutes
    (the sum of the exponential backoffs), in the compose stack and in prefect.yaml's
    job environment alike; the CLI, run by hand, keeps failing within seconds."""
    from config.environment import MLFLOW_HTTP_FAIL_FAST

    worker = compose["services"]["worker"]["environment"]
    deployments = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]
    for env in (worker, *(d["work_pool"]["job_variables"]["env"] for d in deployments)):
        retries = int(env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"])
        backoff = float(env["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"])
        assert 100 <= sum(backoff * 2**k for k in range(retries)) <= 130
        assert 100 <= sum(2**k for k in range(1, int(env["PREFECT_CLIENT_MAX_RETRIES"]) + 1)) <= 130
        assert env["PREFECT_CLIENT_RETRY_EXTRA_CODES"] == "500"  # Prefect, PostgreSQL away
    assert int(MLFLOW_HTTP_FAIL_FAST["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]) <= 3
    assert compose["services"]["prefect-server"]["environment"]["PREFECT_HOME"] == "/srv/prefect"


def test_the_worker_runs_prefects_worker_command_against_the_services(compose):
    from prefect.cli.worker import worker_app

    services = compose["services"]
    for name in ("worker", "worker-gpu"):
        worker = services[name]
        assert worker["entrypoint"] == ["prefect"]
        subcommand, *argv = worker["command"]
        assert subcommand == "worker"
        _, bound, unknown = worker_app.parse_args(argv)  # Prefect's own CLI accepts it
        assert not unknown
        assert bound.arguments["work_pool_name"] == "fedsieve"
        assert bound.arguments["worker_type"] == "process"
        env = worker["environment"]
        server_port = services["prefect-server"]["command"][-1]
        assert env["PREFECT_API_URL"] == f"http://prefect-server:{server_port}/api"
        mlflow_port = next(
            a.split("=")[1] for a in services["mlflow"]["command"] if a.startswith("--port=")
        )
        assert env["MLFLOW_TRACKING_URI"] == f"http://mlflow:{mlflow_port}"
        assert env["FEDSIEVE_HOME"] == "/app"
        assert {"prefect-server", "mlflow"} <= set(worker["depends_on"])
        # `up -d` returns with the deployments registered: the docs' next command runs one
        assert worker["depends_on"]["deploy"]["condition"] == "service_completed_successfully"
        # heartbeats for the zombie-run automation, which the deploy service installs
        assert int(env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"]) >= 30
    assert services["worker-gpu"]["build"]["args"]["TORCH_VARIANT"] == "cuda"


def test_an_ops_worker_of_its_own_takes_the_closing_runs(compose):
    from prefect.cli.worker import worker_app

    ops = compose["services"]["ops-worker"]
    subcommand, *argv = ops["command"]
    _, bound, unknown = worker_app.parse_args(argv)
    assert subcommand == "worker" and not unknown
    assert bound.arguments["work_pool_name"] == "fedsieve-ops"
    assert (
        ops["environment"]["MLFLOW_TRACKING_URI"]
        == compose["services"]["worker"]["environment"]["MLFLOW_TRACKING_URI"]
    )  # it closes the runs where the workers track
    assert "volumes" not in ops  # no data, no results: it only closes runs
    assert ops["environment"]["PREFECT_WORKER_WEBSERVER_HOST"] == "127.0.0.1"


def test_each_worker_s_health_server_has_a_port_of_its_own(compose):
    # on a host network (network_mode: host, as these machines run the stack) two workers
    # on one port would leave the second without a health server
    ports = {}
    for name in ("worker", "ops-worker"):
        environment = compose["services"][name]["environment"]
        port = int(environment.get("PREFECT_WORKER_WEBSERVER_PORT", 8080))  # Prefect's default
        assert environment["FEDSIEVE_HEALTH_URL"] == f"http://127.0.0.1:{port}/health", name
        ports[name] = port
    assert len(set(ports.values())) == len(ports), ports


def test_the_deploy_service_registers_prefect_yaml_with_the_placeholder_kept(compose):
    deploy = compose["services"]["deploy"]
    script = " ".join(deploy["command"])
    steps = [shlex.split(step) for step in script.split("&&")]
    assert steps[0][:3] == ["prefect", "work-pool", "create"] and "fedsieve" in steps[0]
    assert steps[1][:3] == ["prefect", "work-pool", "create"] and "fedsieve-ops" in steps[1]
    assert steps[2] == ["env", "-u", "FEDSIEVE_HOME", "prefect", "--no-prompt", "deploy", "--all"]
    assert steps[3] == ["python", "-m", "flows.automations"]  # after the deployments it runs
    project = yaml.safe_load((REPO / "prefect.yaml").read_text())
    pools = {d["entrypoint"]: d["work_pool"]["name"] for d in project["deployments"]}
    assert pools == {
        "flows/deployment.py:pipeline_from_file": "fedsieve",  # the pipeline
        # what the crashed-run automation runs: on a pool of its own, so that closing a
        # crash needs no training worker (the only one may be gone for good)
        "flows/crashed.py:close_crashed_run": "fedsieve-ops",
    }
    for deployment in project["deployments"]:
        module, _, function = deployment["entrypoint"].partition(":")
        assert (REPO / module).exists() and f"def {function}(" in (REPO / module).read_text()


@pytest.mark.parametrize(("variant", "compiler"), [("cpu", False), ("cuda", True)])
def test_the_cuda_variant_gets_the_c_compiler_triton_needs(variant, compiler):
    # Triton (the aggregation rules' GPU kernels) builds a C launcher on first use; the
    # slim base has no compiler, and the CPU image does not need one.
    _, runtime = stages(parse({"TORCH_VARIANT": variant}))
    [first] = of(runtime, "RUN")[:1]
    script = first.split("&& groupadd")[0]
    shell = subprocess.run(
        ["bash", "-c", script.replace("apt-get", "echo")],
        env={"PATH": os.environ["PATH"], "TORCH_VARIANT": variant},
        capture_output=True,
        text=True,
        check=True,
    )
    assert ("gcc" in shell.stdout and "libc6-dev" in shell.stdout) is compiler


def test_the_site_image_holds_the_engine_torch_and_flower_and_ships_its_source_apart():
    """Dockerfile.site: what a hospital runs. The Makefile's Flower steps before the source
    (no Prefect, MLflow or DVC: the engine's dependencies and the flower extra only), the
    environment and the source as two layers, non-root, the hub's pinned numerics."""
    assert_hadolint_clean(REPO / "Dockerfile.site")
    site = DockerfileParser(fileobj=io.BytesIO((REPO / "Dockerfile.site").read_bytes()))
    build, runtime = stages(site)
    steps = [(i["instruction"], i["value"]) for i in build if i["instruction"] in ("COPY", "RUN")]
    assert [v for kind, v in steps if kind == "COPY"] == ["Makefile pyproject.toml ./", ". ."]
    kinds = [kind for kind, _ in steps]
    deps = next(n for n, (kind, v) in enumerate(steps) if "make deps-flower project-flower" in v)
    assert kinds.index("COPY") < deps < len(kinds) - 1 - kinds[::-1].index("COPY")
    requirements = next(line for line in make_recipe("deps-flower") if "requirements.txt" in line)
    assert '["dependencies"]' in requirements and '["flower"]' in requirements
    assert "hub" not in requirements
    assert "setup-flower: deps-flower project-flower" in (REPO / "Makefile").read_text()
    assert of(runtime, "COPY") == [
        "--from=build --chown=10001:10001 /app/.venv-flower /app/.venv-flower",
        "--from=build --chown=10001:10001 /source /app",
    ]
    assert of(runtime, "USER")[-1].split(":")[0] not in ("root", "0")
    assert json.loads(instructions(site, "ENTRYPOINT")[0]["value"]) == ["fedsieve-site"]
    pinned = (
        "ATEN_CPU_CAPABILITY",
        "ONEDNN_MAX_CPU_ISA",
        "MKL_CBWR",
        "MKL_DYNAMIC",
        "OMP_NUM_THREADS",
    )
    assert {k: site.envs[k] for k in pinned} == {k: parse().envs[k] for k in pinned}


def test_each_site_container_gets_only_its_own_folder_read_only():
    services = yaml.safe_load((REPO / "docker-compose.sites.yml").read_text())["services"]
    assert set(services) == {"site-a", "site-b", "site-c"}
    for name, service in services.items():
        assert service["volumes"] == [f"${{FEDERATION_DIR:?set FEDERATION_DIR}}/{name}:/site:ro"]
        assert (
            service["entrypoint"][0] == "fedsieve-site"
            and "--plan=/site/plan.json" in service["entrypoint"]
        )
        assert "ports" not in service  # outbound only


def test_the_federation_overlay_adds_a_superlink_the_worker_reaches_with_its_own_command(compose):
    """docker-compose.federation.yml on top of the stack: the SuperLink (TLS, node
    authentication, the Fleet API the only port published), sharing the worker's volumes
    at the worker's paths; the worker writes Flower's CLI config for it, then starts
    exactly as the stack's own worker does."""
    from flowerapp.flwr_config import main as flwr_config

    overlay = yaml.safe_load((REPO / "docker-compose.federation.yml").read_text())["services"]
    superlink, worker = overlay["superlink"], overlay["worker"]
    flags = dict(a.removeprefix("--").split("=", 1) for a in superlink["command"] if "=" in a)
    assert "--enable-supernode-auth" in superlink["command"]
    assert {"ssl-ca-certfile", "ssl-certfile", "ssl-keyfile"} <= set(flags)
    assert flags["serverappio-api-address"].startswith("127.0.0.1:")
    [published] = superlink["ports"]
    fleet_port = flags["fleet-api-address"].rsplit(":", 1)[1]
    assert published == f"${{FEDSIEVE_FLEET_BIND:-127.0.0.1}}:{fleet_port}:{fleet_port}"
    worker_volumes = {
        v.split(":")[0]: v.split(":")[1] for v in compose["services"]["worker"]["volumes"]
    }
    for volume in ("artifacts", "medmnist"):  # the ServerApp's files where the pipeline has them
        assert f"{volume}:{worker_volumes[volume]}" in superlink["volumes"]
    assert any(v.endswith("/certs:/federation/certs:ro") for v in superlink["volumes"])

    [script] = worker["command"]
    write, start = (shlex.split(part) for part in script.split("&&"))
    assert worker["entrypoint"] == ["/bin/sh", "-c"]
    assert start == ["exec", *compose["services"]["worker"]["entrypoint"],
                     *compose["services"]["worker"]["command"]]  # fmt: skip
    assert write[:3] == ["python", "-m", "flowerapp.flwr_config"]
    options = dict(zip(write[3::2], write[4::2], strict=True))
    assert options["--home"] == worker["environment"]["FLWR_HOME"]
    assert options["--address"] == f"superlink:{flags['control-api-address'].rsplit(':', 1)[1]}"
    [ca_mount] = worker["volumes"]
    assert ca_mount.endswith(f"/certs/ca.crt:{options['--ca']}:ro")  # the CA only, read-only
    assert options["--connection"] == "hub"
    with pytest.raises(SystemExit):
        flwr_config(["--home", "h", "--connection", "a b", "--address", "x:1", "--ca", "ca.crt"])


def test_both_servers_require_credentials_every_client_has_them_and_none_has_a_default(compose):
    """The mechanisms themselves are exercised on loopback (tests/ops/test_server_auth.py)."""
    services = compose["services"]
    mlflow, prefect = services["mlflow"], services["prefect-server"]
    assert "--app-name=basic-auth" in mlflow["command"]
    assert mlflow["environment"]["MLFLOW_AUTH_CONFIG_PATH"] == "/app/scripts/mlflow-auth.ini"
    assert (REPO / "scripts" / "mlflow-auth.ini").exists()
    secret_of = {
        "prefect": prefect["environment"]["PREFECT_SERVER_API_AUTH_STRING"],
        "mlflow": mlflow["environment"]["MLFLOW_AUTH_ADMIN_PASSWORD"],
        "flask": mlflow["environment"]["MLFLOW_FLASK_SERVER_SECRET_KEY"],
    }
    for value in secret_of.values():  # required from .env, never a default in the file
        assert value.startswith("${FEDSIEVE_") and ":?" in value and ":-" not in value
    clients = [
        s for name, s in services.items() if name in ("deploy", "worker", "worker-gpu", "model")
    ]
    for client in clients:
        env = client["environment"]
        assert env["PREFECT_API_AUTH_STRING"] == secret_of["prefect"]
        assert env["MLFLOW_TRACKING_PASSWORD"] == secret_of["mlflow"]
        assert (
            env["MLFLOW_TRACKING_USERNAME"] == mlflow["environment"]["MLFLOW_AUTH_ADMIN_USERNAME"]
        )
    assert ".env" in (REPO / ".gitignore").read_text().split()
    assert ".env" in (REPO / ".dockerignore").read_text().split()


def test_the_postgres_stand_in_lints_clean_and_honours_the_official_variables():
    """scripts/postgres-standin: for engines that cannot pull postgres:16 (the smoke test
    ran the compose stack on it); the variables and init folder the compose file uses."""
    folder = REPO / "scripts" / "postgres-standin"
    assert_hadolint_clean(folder / "Dockerfile")
    entrypoint = (folder / "entrypoint.sh").read_text()
    assert subprocess.run(["bash", "-n", str(folder / "entrypoint.sh")]).returncode == 0
    postgres = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["postgres"]
    for variable in postgres["environment"]:
        assert variable in entrypoint
    assert "/docker-entrypoint-initdb.d/" in entrypoint
    assert any(
        v.endswith("/docker-entrypoint-initdb.d/10-prefect.sql:ro") for v in postgres["volumes"]
    )
