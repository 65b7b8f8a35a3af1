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

from fedsieve.cli import COMMANDS

REPO = Path(__file__).resolve().parents[2]
HADOLINT = Path(sys.executable).parent / "hadolint"


def parse(build_args: dict[str, str] | None = None) -> DockerfileParser:
    return DockerfileParser(
        fileobj=io.BytesIO((REPO / "Dockerfile").read_bytes()), build_args=build_args or {}
    )


def instructions(parser: DockerfileParser, name: str) -> list[dict[str, Any]]:
    return [i for i in parser.structure if i["instruction"] == name]


def setup_recipe() -> list[str]:
    """The Makefile's `setup` target, one command per line."""
    lines = (REPO / "Makefile").read_text().splitlines()
    start = lines.index("setup:") + 1
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


def test_hadolint_finds_no_errors():
    done = subprocess.run(
        [str(HADOLINT), "--failure-threshold", "error", str(REPO / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("variant", ["cpu", "cuda"])
def test_both_variants_build_from_python_slim_and_run_make_setup(variant):
    parser = parse({"TORCH_VARIANT": variant})
    assert parser.baseimage == "python:3.11-slim"
    [setup] = [i["value"] for i in instructions(parser, "RUN") if "make setup" in i["value"]]
    # The variant only chooses torch's index; an unknown one stops the build.
    assert re.search(rf"\b{variant}\)", setup) and "exit 1" in setup
    assert "PIP_EXTRA_INDEX_URL" in setup.split("cuda)")[0]


def test_torch_variant_defaults_to_cpu(dockerfile):
    args = [i["value"] for i in instructions(dockerfile, "ARG")]
    assert "TORCH_VARIANT=cpu" in args


def test_the_image_installs_exactly_as_make_setup(dockerfile):
    recipe = setup_recipe()
    pip_lines = [line for line in recipe if "pip install" in line]
    assert len(pip_lines) == 3
    assert "torch==2.13.0" in pip_lines[0]
    assert '-e ".[dev]"' in pip_lines[1]
    assert "--no-deps medmnist==3.0.2" in pip_lines[2]
    runs = [i["value"] for i in instructions(dockerfile, "RUN")]
    assert sum("make setup" in run for run in runs) == 1
    assert not any("pip install" in run for run in runs), "install steps must not diverge"
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv", "mlflow.db", ".prefect"} <= set(ignored)
    assert not {"Makefile", "pyproject.toml", "params.yaml"} & set(ignored)


def test_the_image_runs_as_non_root_with_fedsieve_as_entry_point(dockerfile):
    users = [i["value"] for i in instructions(dockerfile, "USER")]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    first_user = instructions(dockerfile, "USER")[0]["startline"]
    setup = next(i for i in instructions(dockerfile, "RUN") if "make setup" in i["value"])
    assert first_user < setup["startline"], "the project is installed by the non-root user"
    [entrypoint] = instructions(dockerfile, "ENTRYPOINT")
    [cmd] = instructions(dockerfile, "CMD")
    assert json.loads(entrypoint["value"]) == ["fedsieve"]
    assert json.loads(cmd["value"]) == ["run"] and "run" in COMMANDS
    [healthcheck] = instructions(dockerfile, "HEALTHCHECK")
    assert "FEDSIEVE_HEALTH_URL" in healthcheck["value"]
    env = dockerfile.envs
    assert env["DO_NOT_TRACK"] == "true" and env["MLFLOW_DISABLE_TELEMETRY"] == "true"
    assert env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    assert env["PATH"].startswith("/app/.venv/bin")


def test_compose_has_the_servers_the_deployments_and_a_worker(compose):
    services = compose["services"]
    assert {"mlflow", "prefect-server", "deploy", "worker"} <= set(services)
    for name in ("mlflow", "prefect-server", "worker"):
        assert "healthcheck" in services[name] or "FEDSIEVE_HEALTH_URL" in str(
            services[name].get("environment")
        ), name
    for name in ("mlflow", "prefect-server"):
        assert services[name]["healthcheck"]["test"][0] == "CMD"


def test_compose_publishes_ports_on_loopback_only(compose):
    published = [
        (name, port) for name, s in compose["services"].items() for port in s.get("ports", [])
    ]
    assert published, "the UIs should be reachable from the host"
    for name, port in published:
        assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def test_compose_volumes_are_declared_and_hold_the_state(compose):
    declared = set(compose["volumes"])
    used = {
        volume.split(":")[0]
        for service in compose["services"].values()
        for volume in service.get("volumes", [])
    }
    assert used <= declared
    mounts = {
        name: [v.split(":")[1] for v in s.get("volumes", [])]
        for name, s in compose["services"].items()
    }
    assert "/srv/mlflow" in mounts["mlflow"] and "/srv/prefect" in mounts["prefect-server"]
    assert "sqlite:////srv/mlflow/mlflow.db" in " ".join(compose["services"]["mlflow"]["command"])
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
    assert services["worker-gpu"]["build"]["args"]["TORCH_VARIANT"] == "cuda"


def test_the_deploy_service_registers_prefect_yaml_with_the_placeholder_kept(compose):
    deploy = compose["services"]["deploy"]
    script = " ".join(deploy["command"])
    steps = [shlex.split(step) for step in script.split("&&")]
    assert steps[0][:3] == ["prefect", "work-pool", "create"] and "fedsieve" in steps[0]
    assert steps[1] == ["env", "-u", "FEDSIEVE_HOME", "prefect", "--no-prompt", "deploy", "--all"]
    project = yaml.safe_load((REPO / "prefect.yaml").read_text())
    [deployment] = project["deployments"]
    assert deployment["work_pool"]["name"] == "fedsieve"
    module, _, function = deployment["entrypoint"].partition(":")
    assert (REPO / module).exists() and f"def {function}(" in (REPO / module).read_text()


@pytest.mark.parametrize(("variant", "compiler"), [("cpu", False), ("cuda", True)])
def test_the_cuda_variant_gets_the_c_compiler_triton_needs(variant, compiler):
    # Triton (the aggregation rules' GPU kernels) builds a C launcher on first use; the
    # slim base has no compiler, and the CPU image does not need one.
    parser = parse({"TORCH_VARIANT": variant})
    [apt] = [i["value"] for i in instructions(parser, "RUN") if "apt-get install" in i["value"]]
    arguments = apt.split("apt-get install", 1)[1].split("&&", 1)[0]
    shell = subprocess.run(
        ["bash", "-c", f"echo {arguments}"],
        env={"PATH": os.environ["PATH"], "TORCH_VARIANT": variant},
        capture_output=True,
        text=True,
        check=True,
    )
    packages = shell.stdout.split()
    assert "make" in packages
    assert ("gcc" in packages and "libc6-dev" in packages) is compiler
