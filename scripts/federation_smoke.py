"""A federation of real sites in containers, end to end (``make federation-smoke``).

1. build the site image (Dockerfile.site: the engine, torch and Flower);
2. write the hub's side and each site's folder as their operators would: BreastMNIST
   partitioned into three site files (``fedsieve sites``), the training plan
   (``fedsieve plan``), the CA and SuperLink certificate, one key pair per site made in
   that site's folder;
3. start the SuperLink container (TLS, SuperNode authentication), register the three
   public keys, start the three site containers (each given only its own folder);
4. run the hub's pipeline on this machine (``fedsieve run`` with
   ``federation.runtime: flower``: Prefect flow, MLflow run, ``flwr run``, evaluation,
   model registry);
5. check: every round ran with all three sites, the sites scored the model on their own
   splits, the MLflow run finished, the final model equals the same federation simulated
   in this process (1e-6), no site container logged a traceback, and each site container
   mounts its own folder only;
6. tear everything down (also on failure; ``--keep`` keeps the folder for a look).

Needs a Docker engine with Compose (v2 ``docker compose`` or v1 ``docker-compose``),
``make setup`` (the hub's ``.venv`` and ``.venv-flower``) and BreastMNIST in
``MEDMNIST_ROOT``. Runs as root or as uid 10001 (the site containers' user reads the
site keys). Prints each step's wall time. ``DOCKER_BUILD_ARGS``: extra build arguments
(a local torch index, for example).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from flowerapp.flwr_config import write_cli_config

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "docker-compose.federation.yml"
IMAGE = "fedsieve-site:cpu"
SITES = ("site-a", "site-b", "site-c")
SITE_UID = 10001
HUB_BIN = REPO / ".venv" / "bin"
FLOWER_BIN = REPO / ".venv-flower" / "bin"
CONTROL_API = "127.0.0.1:9093"
TOLERANCE = 1e-6
# every .npz file a site container's user can open, anywhere in its filesystem
FIND_DATA = """
import os
for root, _, files in os.walk("/"):
    if root.startswith(("/proc", "/sys")):
        continue
    for name in files:
        if name.endswith(".npz") and os.access(os.path.join(root, name), os.R_OK):
            print(os.path.join(root, name))
"""
UNANSWERED = {"client_timeout", "client_unavailable", "client_error"}

PARAMS: dict[str, Any] = {
    "seed": 0,
    "data": {"dataset": "breastmnist"},
    "partition": {"num_clients": len(SITES), "scheme": "iid", "local_test": 0.2},
    "model": {"name": "logreg"},
    "train": {"rounds": 3, "local_epochs": 2, "lr": 0.05, "device": "cpu", "backend": "sequential"},
    "filters": [{"name": "pid_made"}],
    "noniid": {"every": 0, "final": False},
    "eval": {"every": 1},
}


RECORD: dict[str, Any] = {"steps_s": {}, "checks": {}}  # what --results writes


class SmokeError(RuntimeError):
    """A step that did not do what it should: one line saying which and why."""


@contextlib.contextmanager
def step(name: str) -> Iterator[None]:
    print(f"== {name}", flush=True)
    started = time.monotonic()
    yield
    RECORD["steps_s"][name] = round(time.monotonic() - started, 1)
    print(f"   {time.monotonic() - started:.0f} s", flush=True)


def run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``command`` to its end; :class:`SmokeError` with its output's tail if it fails."""
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        tail = (done.stdout[-2000:] + done.stderr[-3000:]).strip()
        raise SmokeError(f"{shlex.join(command[:4])} ... exited {done.returncode}:\n{tail}")
    return done


def compose_command() -> list[str]:
    """Compose (v2 or v1) on docker-compose.federation.yml."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose", "-f", str(COMPOSE_FILE)]
    if shutil.which("docker-compose"):
        return ["docker-compose", "-f", str(COMPOSE_FILE)]
    raise SmokeError("neither 'docker compose' nor 'docker-compose' is installed")


def folders(work: Path) -> tuple[Path, Path]:
    """The hub's project folder and the federation folder (certificates, SuperLink
    database, one folder per site) in the smoke's work folder."""
    return work / "project", work / "federation"


def compose_environment(work: Path, medmnist_root: Path) -> dict[str, str]:
    """What docker-compose.federation.yml reads: the folders, the data, the hub's user."""
    hub, federation = folders(work)
    return os.environ | {
        "FEDERATION_DIR": str(federation), "HUB_DIR": str(hub),
        "MEDMNIST_ROOT": str(medmnist_root), "HUB_USER": f"{os.getuid()}:{os.getgid()}",
    }  # fmt: skip


def wait_for_port(address: str, timeout: float = 60) -> None:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 1):
            return
        time.sleep(0.5)
    raise SmokeError(f"nothing listens on {address} after {timeout:.0f} s")


class Flwr:
    """The ``flwr`` CLI of ``.venv-flower``, connected to the SuperLink's Control API."""

    def __init__(self, home: Path, ca_cert: Path) -> None:
        write_cli_config(home, "hub", CONTROL_API, ca_cert)
        self.env = os.environ | {
            "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
        }  # fmt: skip

    def json(self, *args: str) -> dict[str, Any]:
        done = run([str(FLOWER_BIN / "flwr"), *args, "--format", "json"], env=self.env, timeout=60)
        return dict(json.loads(done.stdout))

    def wait_online(self, node_ids: list[int], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            nodes = self.json("supernode", "ls")["nodes"]
            if set(node_ids) <= {int(n["node-id"]) for n in nodes if n["status"] == "online"}:
                return
            time.sleep(1)
        raise SmokeError(f"sites {node_ids} not all online after {timeout:.0f} s")


def layer_sizes() -> dict[str, float]:
    """The image's two big layers in MB: the environment and the source (what a source
    edit ships)."""
    history = run(["docker", "history", "--human=false", "--no-trunc", "--format",
                   "{{.Size}}\t{{.CreatedBy}}", IMAGE]).stdout.splitlines()  # fmt: skip
    sizes = {}
    for line in history:  # COPY layers read "COPY ... dir:<hash> in <destination>"
        size, created_by = line.split("\t", 1)
        destination = created_by.strip().rsplit(" in ", 1)[-1]
        if "COPY" in created_by and destination in ("/app/.venv-flower", "/app"):
            sizes["environment" if destination.endswith("flower") else "source"] = round(
                int(size) / 1e6, 1
            )
    return sizes


def prepare(work: Path, medmnist_root: Path) -> tuple[Path, Path, dict[str, int]]:
    """The hub's project and the federation folder as the operators leave them; each
    site's registered sample count."""
    hub, federation = folders(work)
    hub.mkdir()
    (hub / "params.yaml").write_text(yaml.safe_dump(PARAMS, sort_keys=False))
    env = os.environ | {"MEDMNIST_ROOT": str(medmnist_root)}
    run([str(HUB_BIN / "fedsieve"), "sites", "--out", str(work / "sites")], cwd=hub, env=env)
    run([str(HUB_BIN / "fedsieve"), "plan", "--out", str(work / "plan.json")], cwd=hub, env=env)
    certs = federation / "certs"
    run([str(FLOWER_BIN / "python"), "-m", "flowerapp.certs", "--out", str(certs)])
    (federation / "superlink").mkdir()
    listed = json.loads((work / "sites" / "sites.json").read_text())
    samples = {}
    for k, (name, row) in enumerate(zip(SITES, listed, strict=True)):
        folder = federation / name  # what this site's operator holds, and nothing else
        run([str(FLOWER_BIN / "python"), "-m", "flowerapp.certs", "--out", str(folder),
             "--no-tls", "--site", "site"])  # fmt: skip
        shutil.copy(work / "sites" / f"site-{k}.npz", folder / "data.npz")
        shutil.copy(work / "plan.json", folder / "plan.json")
        shutil.copy(certs / "ca.crt", folder / "ca.crt")
        if os.geteuid() == 0:  # the container's user must read its key (mode 0600)
            for path in (folder, *folder.iterdir()):
                os.chown(path, SITE_UID, SITE_UID)
        samples[name] = int(row["samples"])
    return hub, federation, samples


def check(claims: list[tuple[str, bool, str]]) -> None:
    for claim, ok, detail in claims:
        RECORD["checks"][claim] = ok
        print(f"   {'ok  ' if ok else 'FAIL'} {claim}{'' if ok else f': {detail}'}")
    failed = [claim for claim, ok, _ in claims if not ok]
    if failed:
        raise SmokeError(f"{len(failed)} check(s) failed: {'; '.join(failed)}")


def simulated_vector(params_file: Path, sites: Path, medmnist_root: Path) -> Any:
    """The final global vector of the same federation simulated in this process."""
    from config.params import load_params
    from federated.data import load_medmnist
    from federated.loop import train
    from flowerapp.hub import simulated_federation

    params = load_params(params_file, [])
    data = load_medmnist(params.data.dataset, medmnist_root, params.data.size)
    files = [sites / f"site-{k}.npz" for k in range(len(SITES))]
    federation = simulated_federation(params, data, files)
    return train(federation, federation.initial_state(), params.train.rounds).global_vector


def smoke(work: Path, medmnist_root: Path, compose: list[str]) -> None:
    with step(f"build {IMAGE} (Dockerfile.site)"):
        build_args = shlex.split(os.environ.get("DOCKER_BUILD_ARGS", ""))
        run(["docker", "build", "--network", "host", *build_args, "-f", "Dockerfile.site",
             "-t", IMAGE, "."], cwd=REPO, timeout=1800)  # fmt: skip
        size = run(["docker", "image", "inspect", IMAGE, "--format", "{{.Size}}"]).stdout
        print(f"   image size: {int(size) / 1e9:.2f} GB")
        RECORD["image_gb"] = round(int(size) / 1e9, 2)
        RECORD["layers_mb"] = layer_sizes()
        print(f"   environment / source layers: {RECORD['layers_mb']} MB")

    with step("the operators' files: site data, training plan, certificates, site keys"):
        hub, federation, samples = prepare(work, medmnist_root)
    compose_env = compose_environment(work, medmnist_root)
    up = [*compose, "up", "-d", "--no-build"]

    with step("SuperLink container up; the three sites' public keys registered"):
        run([*up, "superlink"], env=compose_env, timeout=300)
        wait_for_port(CONTROL_API)
        flwr = Flwr(work / "flwr", federation / "certs" / "ca.crt")
        nodes = {
            name: int(flwr.json("supernode", "register", str(federation / name / "site.pub"))["node-id"])
            for name in SITES
        }  # fmt: skip

    with step("three site containers up, each connected"):
        run([*up, *SITES], env=compose_env, timeout=300)
        flwr.wait_online(list(nodes.values()))

    params = PARAMS | {
        "federation": {
            "runtime": "flower", "superlink": "hub", "round_timeout": 120,
            "sites": [{"name": n, "node_id": nodes[n], "samples": samples[n]} for n in SITES],
        },
    }  # fmt: skip
    (hub / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    with step("fedsieve run at the sites (Prefect flow, MLflow run, flwr run, evaluation)"):
        env = flwr.env | {
            "MEDMNIST_ROOT": str(medmnist_root), "FEDSIEVE_FLOWER_BIN": str(FLOWER_BIN),
            "MLFLOW_TRACKING_URI": f"sqlite:///{hub / 'mlflow.db'}",
        }  # fmt: skip
        env.pop("PREFECT_API_URL", None)
        run([str(HUB_BIN / "fedsieve"), "run"], cwd=hub, env=env, timeout=1200)

    with step("checks"):
        verify(work, hub, federation, compose, compose_env, medmnist_root)


def verify(
    work: Path, hub: Path, federation: Path, compose: list[str], compose_env: dict[str, str],
    medmnist_root: Path,
) -> None:  # fmt: skip
    import csv

    from mlflow import MlflowClient

    from config.params import load_params, params_hash
    from federated.checkpoint import read_checkpoint
    from federated.server import ServerState

    params = load_params(hub / "params.yaml", [])
    saved = read_checkpoint(hub / "artifacts" / "checkpoints" / "train.pt", params_hash(params))
    if saved is None:
        raise SmokeError("the train stage left no checkpoint for these params")
    state = ServerState.from_dict(saved["state"])
    rounds = list(csv.DictReader((hub / "reports" / "rounds.csv").open()))
    sites = json.loads((hub / "reports" / "sites.json").read_text())["sites"]
    tracking = json.loads((hub / "artifacts" / "model" / "tracking.json").read_text())
    client = MlflowClient(f"sqlite:///{hub / 'mlflow.db'}")
    run_info = client.get_run(tracking["run_id"]).info
    versions = client.search_model_versions(f"run_id = '{tracking['run_id']}'")
    simulated = simulated_vector(hub / "params.yaml", work / "sites", medmnist_root)
    diff = float((state.global_vector - simulated).abs().max())
    RECORD["max_abs_diff_vs_simulation"] = diff
    answered = {
        (row["round"], row["client"]) for row in state.trail if row["reason"] not in UNANSWERED
    }
    logs = run([*compose, "logs", "--no-color", *SITES], env=compose_env).stdout
    in_image = set(
        run(
            ["docker", "run", "--rm", "--entrypoint", "python", IMAGE, "-c", FIND_DATA]
        ).stdout.split()
    )
    mounts, visible = {}, {}
    for name in SITES:
        container = run([*compose, "ps", "-q", name], env=compose_env).stdout.strip()
        inspected = json.loads(run(["docker", "inspect", container]).stdout)[0]
        mounts[name] = [(m["Source"], m["Destination"], m["RW"]) for m in inspected["Mounts"]]
        found = run(["docker", "exec", container, "python", "-c", FIND_DATA]).stdout.split()
        visible[name] = sorted(set(found) - in_image)  # beyond what the image itself holds
    rounds_wanted = params.train.rounds
    check([
        (f"{rounds_wanted} rounds in the checkpoint and rounds.csv",
         state.round == rounds_wanted and len(rounds) == rounds_wanted, f"{state.round}, {len(rounds)}"),
        ("every site answered every round", len(answered) == rounds_wanted * len(SITES), str(sorted(answered))),
        ("the sites scored the final model on their own splits (reports/sites.json)",
         len(sites) == len(SITES) and all(float(r["n"]) > 0 for r in sites), str(sites)),
        ("the MLflow run finished and its model is registered",
         run_info.status == "FINISHED" and len(versions) == 1, f"{run_info.status}, {versions}"),
        (f"the sites' model equals the simulation's (max diff {diff:.1e} <= {TOLERANCE:g})",
         diff <= TOLERANCE, f"{diff:.3e}"),
        ("no traceback in the site containers' logs", "Traceback" not in logs, logs[-2000:]),
        ("each site container mounts its own folder only, read-only",
         all(m == [(str(federation / n), "/site", False)] for n, m in mounts.items()), str(mounts)),
        ("no site can read another's data: beyond the image, each sees one .npz file, its own",
         all(files == ["/site/data.npz"] for files in visible.values()), str(visible)),
    ])  # fmt: skip


def environment() -> dict[str, Any]:
    """The machine and versions beside the numbers (the base image is what the engine
    here offers: see docs/federation.md)."""
    import platform

    docker = run(["docker", "version", "--format", "{{.Server.Version}}"]).stdout.strip()
    python = run(["docker", "run", "--rm", "--entrypoint", "python", IMAGE, "-c",
                  "import sys; print(sys.version.split()[0], sys.executable)"]).stdout.strip()  # fmt: skip
    return {"cpu_count": os.cpu_count(), "machine": platform.machine(), "docker": docker,
            "image_python": python}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--results", type=Path, help="write the step times and checks (JSON)")
    args = parser.parse_args()
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        print("federation-smoke: no Docker engine answers (docker info failed)", file=sys.stderr)
        return 2
    medmnist_root = Path(os.environ.get("MEDMNIST_ROOT", REPO / "data" / "medmnist")).resolve()
    if not (medmnist_root / "breastmnist.npz").is_file():
        print(
            f"federation-smoke: no breastmnist.npz in {medmnist_root}; set MEDMNIST_ROOT",
            file=sys.stderr,
        )
        return 2
    compose = compose_command()
    work = Path(tempfile.mkdtemp(prefix="fedsieve-federation-"))
    os.chmod(work, 0o755)  # the containers' user walks into its folders
    started = time.monotonic()
    try:
        smoke(work, medmnist_root, compose)
    except (SmokeError, subprocess.TimeoutExpired) as error:
        print(f"federation-smoke: {error}", file=sys.stderr)
        return 1
    finally:
        env = compose_environment(work, medmnist_root)
        logs = subprocess.run([*compose, "logs", "--no-color"], env=env,
                              capture_output=True, text=True)  # fmt: skip
        (work / "compose.log").write_text(logs.stdout + logs.stderr)
        subprocess.run([*compose, "down", "--volumes", "--remove-orphans"], env=env,
                       capture_output=True)  # fmt: skip
        if args.keep:
            print(f"federation-smoke: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    RECORD["total_s"] = round(time.monotonic() - started, 1)
    if args.results:
        record = {"command": "make federation-smoke", **RECORD, **environment()}
        args.results.write_text(json.dumps(record, indent=1) + "\n")
    print(f"federation-smoke: passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
