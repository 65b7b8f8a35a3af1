"""A federation of real sites in containers, end to end (``make federation-smoke``).

1. build the site image (Dockerfile.site: the engine, torch and Flower) and the hub's
   image (Dockerfile: the pipeline, Prefect, MLflow, Flower's CLI);
2. write the hub's side and each site's folder as their operators would: BreastMNIST
   partitioned into three site files (``fedsieve sites``), the training plan
   (``fedsieve plan``), the CA and SuperLink certificate, one key pair per site made in
   that site's folder;
3. bring the hub's compose stack up: PostgreSQL, MLflow and Prefect behind
   authentication, the deployments, the worker, and the SuperLink (TLS, SuperNode
   authentication; docker-compose.federation.yml); register the three sites' public keys
   from the worker, with Flower's CLI;
4. start the three site containers (docker-compose.sites.yml, each given only its own
   folder) and wait until all are online;
5. run the pipeline's deployment on the worker with ``federation.runtime: flower``
   (Prefect flow run, MLflow run on the server, ``flwr run``, evaluation, model registry);
6. check: the flow run completed and its own MLflow run finished with a model version,
   every round ran with all three sites, the sites scored the model on their own splits,
   the final model equals the same federation simulated in this process (1e-6), no
   container logged a traceback, and each site container mounts its own folder only;
7. tear everything down, volumes included (also on failure; ``--keep`` keeps the work
   folder for a look).

Needs a Docker engine with Compose (v2 ``docker compose`` or v1 ``docker-compose``),
``make setup`` (the hub's ``.venv`` and ``.venv-flower``) and BreastMNIST in
``MEDMNIST_ROOT``. Runs as root or as uid 10001 (the site containers' user reads the
site keys). Prints each step's wall time. ``DOCKER_BUILD_ARGS``: extra build arguments
(a local torch index, for example). An engine without a bridge network runs every
service on the host's network (scripts/compose_host_network.py), as the container smoke
does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from scripts.stack_steps import (
    MLFLOW_URI,
    StepError,
    client_credentials,
    compose_command,
    host_network,
    on_host_network,
    run,
    stack_credentials,
    wait_for,
)

REPO = Path(__file__).resolve().parents[1]
HUB_COMPOSE = (REPO / "docker-compose.yml", REPO / "docker-compose.federation.yml")
SITES_COMPOSE = REPO / "docker-compose.sites.yml"
SITE_IMAGE, HUB_IMAGE = "fedsieve-site:cpu", "fedsieve:cpu"
PROJECT = "fedsieve-federation-smoke"
SITES = ("site-a", "site-b", "site-c")
SITE_UID = 10001
HUB_BIN = REPO / ".venv" / "bin"
FLOWER_BIN = REPO / ".venv-flower" / "bin"
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
    # as measured (the banned left out of the statistics, as the record was made)
    "filters": [{"name": "pid_made", "threshold": "robust", "banned_updates": "left_out"}],
    "noniid": {"every": 0, "final": False},
    "eval": {"every": 1},
    "tracking": {"experiment": "federation-smoke"},
}


RECORD: dict[str, Any] = {"steps_s": {}, "checks": {}}  # what --results writes


@contextlib.contextmanager
def step(name: str) -> Iterator[None]:
    print(f"== {name}", flush=True)
    started = time.monotonic()
    yield
    RECORD["steps_s"][name] = round(time.monotonic() - started, 1)
    print(f"   {time.monotonic() - started:.0f} s", flush=True)


class Stack:
    """The hub's compose stack with the federation overlay, and the sites' compose file,
    as one Compose project; the environment both read."""

    def __init__(self, work: Path, medmnist_root: Path) -> None:
        self.compose = [*compose_command(), "-p", PROJECT]
        files = [on_host_network(path, work / f"host-{path.name}") for path in HUB_COMPOSE]
        data = work / "compose-data.yml"  # the official files, read-only, for both readers
        mount = {"volumes": [f"{medmnist_root}:/medmnist:ro"]}
        data.write_text(yaml.safe_dump({"services": {
            "worker": {"environment": {"MEDMNIST_ROOT": "/medmnist"}, **mount}, "superlink": mount,
        }}))  # fmt: skip
        self.hub = [*self.compose, *(a for f in (*files, data) for a in ("-f", str(f)))]
        self.sites = [*self.compose, "-f", str(SITES_COMPOSE)]
        self.env = os.environ | stack_credentials() | {
            "FEDSIEVE_FEDERATION_DIR": str(work / "federation"),
            "FEDERATION_DIR": str(work / "federation"),
        }  # fmt: skip

    def __call__(
        self, *args: str, sites: bool = False, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        return run([*(self.sites if sites else self.hub), *args], env=self.env, **kwargs)

    def container(self, service: str, *, sites: bool = False) -> str:
        return self("ps", "-q", service, sites=sites).stdout.strip()

    def flwr(self, *args: str, stdin: str | None = None) -> dict[str, Any]:
        """Flower's CLI in the worker container, against the SuperLink, JSON out."""
        command = ["exec", "-T", "worker", "flwr", *args, "--format", "json"]
        return dict(json.loads(self(*command, input=stdin, timeout=120).stdout))

    def client_env(self) -> dict[str, str]:
        """What a client of the servers needs (the worker's credentials)."""
        return self.env | client_credentials(self.env)

    def down(self, work: Path) -> None:
        logs = [subprocess.run([*c, "logs", "--no-color"], env=self.env, capture_output=True,
                               text=True) for c in (self.hub, self.sites)]  # fmt: skip
        (work / "compose.log").write_text("".join(done.stdout + done.stderr for done in logs))
        # one Compose project, two files: the sites' down must not take the hub's containers
        # for orphans (Compose v1 then removed them without their anonymous volumes); the
        # hub's down, last, removes what is left, volumes included
        subprocess.run([*self.sites, "down", "--volumes"], env=self.env, capture_output=True)
        subprocess.run([*self.hub, "down", "--volumes", "--remove-orphans"], env=self.env,
                       capture_output=True)  # fmt: skip


def layer_sizes(image: str, destinations: dict[str, str]) -> dict[str, float]:
    """The image's COPY layers in MB, named by where they land (``destinations``:
    path -> name): the environment and the source (what a source edit ships)."""
    history = run(["docker", "history", "--human=false", "--no-trunc", "--format",
                   "{{.Size}}\t{{.CreatedBy}}", image]).stdout.splitlines()  # fmt: skip
    sizes = {}
    for line in history:  # COPY layers read "COPY ... dir:<hash> in <destination>"
        size, created_by = line.split("\t", 1)
        destination = created_by.strip().rsplit(" in ", 1)[-1]
        if "COPY" in created_by and destination in destinations:
            sizes[destinations[destination]] = round(int(size) / 1e6, 1)
    return sizes


def build(image: str, dockerfile: str, layers: dict[str, str]) -> None:
    build_args = shlex.split(os.environ.get("DOCKER_BUILD_ARGS", ""))
    run(["docker", "build", "--network", "host", *build_args, "-f", dockerfile, "-t", image, "."],
        cwd=REPO, timeout=3600)  # fmt: skip
    size = int(run(["docker", "image", "inspect", image, "--format", "{{.Size}}"]).stdout)
    RECORD.setdefault("images", {})[image] = {
        "gb": round(size / 1e9, 2), "layers_mb": layer_sizes(image, layers)
    }  # fmt: skip
    print(f"   {image}: {size / 1e9:.2f} GB; {RECORD['images'][image]['layers_mb']} MB")


def prepare(work: Path, medmnist_root: Path) -> dict[str, int]:
    """The hub's files and the federation folder as the operators leave them; each
    site's registered sample count."""
    hub, federation = work / "project", work / "federation"
    hub.mkdir()
    (hub / "params.yaml").write_text(yaml.safe_dump(PARAMS, sort_keys=False))
    env = os.environ | {"MEDMNIST_ROOT": str(medmnist_root)}
    run([str(HUB_BIN / "fedsieve"), "sites", "--out", str(work / "sites")], cwd=hub, env=env)
    run([str(HUB_BIN / "fedsieve"), "plan", "--out", str(work / "plan.json")], cwd=hub, env=env)
    certs = federation / "certs"  # the worker dials `superlink`; the sites, this host
    run([str(FLOWER_BIN / "python"), "-m", "flowerapp.certs", "--out", str(certs),
         "--host", "superlink", "--host", "127.0.0.1", "--host", "localhost"])  # fmt: skip
    for path in (certs, *certs.iterdir()):  # the SuperLink's user reads them
        if os.geteuid() == 0:
            os.chown(path, SITE_UID, SITE_UID)
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
    return samples


def check(claims: list[tuple[str, bool, str]]) -> None:
    for claim, ok, detail in claims:
        RECORD["checks"][claim] = ok
        print(f"   {'ok  ' if ok else 'FAIL'} {claim}{'' if ok else f': {detail}'}")
    failed = [claim for claim, ok, _ in claims if not ok]
    if failed:
        raise StepError(f"{len(failed)} check(s) failed: {'; '.join(failed)}")


def simulated_vector(params: Any, sites: Path, medmnist_root: Path) -> Any:
    """The final global vector of the same federation simulated in this process."""
    from federated.data import load_medmnist
    from federated.loop import train
    from flowerapp.hub import simulated_federation

    data = load_medmnist(params.data.dataset, medmnist_root, params.data.size)
    files = [sites / f"site-{k}.npz" for k in range(len(SITES))]
    federation = simulated_federation(params, data, files)
    return train(federation, federation.initial_state(), params.train.rounds).global_vector


def run_deployment_at_sites(stack: Stack, raw: dict[str, Any]) -> str:
    """The pipeline's deployment, run on the worker with these params; its flow run id."""
    script = (
        "import json, sys\n"
        "from prefect.deployments import run_deployment\n"
        "run = run_deployment('pipeline-from-file/fedsieve', parameters={'params': json.loads(sys.argv[1])},"
        " timeout=1500, poll_interval=3)\n"
        "print(json.dumps({'id': str(run.id), 'state': run.state.type.value, 'message': run.state.message}))\n"
    )  # fmt: skip
    done = run([str(HUB_BIN / "python"), "-c", script, json.dumps(raw)], env=stack.client_env(),
               timeout=1800)  # fmt: skip
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    if outcome["state"] != "COMPLETED":
        raise StepError(f"the deployment run ended {outcome['state']}: {outcome['message']}")
    return str(outcome["id"])


def smoke(work: Path, medmnist_root: Path, stack: Stack) -> None:
    with step(f"build {SITE_IMAGE} (Dockerfile.site) and {HUB_IMAGE} (Dockerfile)"):
        build(SITE_IMAGE, "Dockerfile.site", {"/app/.venv-flower": "environment", "/app": "source"})
        build(HUB_IMAGE, "Dockerfile", {"/app/.venv": "environment", "/app": "source",
                                        "/app/.venv-flower-cli": "flower_cli"})  # fmt: skip

    with step("the operators' files: site data, training plan, certificates, site keys"):
        samples = prepare(work, medmnist_root)

    with step("the hub's stack up: PostgreSQL, MLflow, Prefect, deployments, worker, SuperLink"):
        stack("up", "-d", "--no-build", "postgres", "mlflow", "prefect-server", timeout=600)
        stack("run", "--rm", "deploy", timeout=600)
        stack("up", "-d", "--no-build", "worker", "superlink", timeout=600)
        wait_for("the worker's Flower CLI reaching the SuperLink",
                 lambda: stack.flwr("supernode", "ls") is not None, timeout=180, interval=3,
                 tolerate=(StepError,))  # fmt: skip

    with step("the sites' public keys registered from the worker; three site containers up"):
        federation = work / "federation"
        nodes = {
            name: int(stack.flwr("supernode", "register", "/dev/stdin",
                                 stdin=(federation / name / "site.pub").read_text())["node-id"])
            for name in SITES
        }  # fmt: skip
        stack("up", "-d", "--no-build", *SITES, sites=True, timeout=300)

        def online() -> bool:
            listed = stack.flwr("supernode", "ls")["nodes"]
            return set(nodes.values()) <= {
                int(n["node-id"]) for n in listed if n["status"] == "online"
            }

        wait_for("all three sites online", online, timeout=180, interval=2, tolerate=(StepError,))

    raw = PARAMS | {
        "data": PARAMS["data"] | {"root": "/medmnist"},  # the official files, mounted there
        "federation": {
            "runtime": "flower", "superlink": "hub", "round_timeout": 120,
            "sites": [{"name": n, "node_id": nodes[n], "samples": samples[n]} for n in SITES],
        },
    }  # fmt: skip
    with step("the pipeline's deployment run on the worker, trained at the sites"):
        flow_run_id = run_deployment_at_sites(stack, raw)

    with step("checks"):
        verify(work, stack, raw, flow_run_id, medmnist_root)


def copied_from_worker(stack: Stack, work: Path, paths: list[str]) -> Path:
    """The worker's files (checkpoint, reports) copied out of its container."""
    out = work / "from-worker"
    out.mkdir()
    worker = stack.container("worker")
    for path in paths:
        run(["docker", "cp", f"{worker}:{path}", str(out / Path(path).name)])
    return out


def verify(
    work: Path, stack: Stack, raw: dict[str, Any], flow_run_id: str, medmnist_root: Path
) -> None:
    import csv

    from mlflow import MlflowClient

    from config.params import Params, params_hash
    from federated.checkpoint import read_checkpoint
    from federated.server import ServerState

    params = Params.model_validate(raw)
    copied = copied_from_worker(stack, work, [
        "/app/artifacts/checkpoints/train.pt", "/app/reports/rounds.csv", "/app/reports/sites.json",
        "/app/artifacts/hub/exchanges.jsonl",
    ])  # fmt: skip
    answers = [
        site["warm"]
        for line in (copied / "exchanges.jsonl").read_text().splitlines()
        for site in json.loads(line)["sites"].values()
    ]
    saved = read_checkpoint(copied / "train.pt", params_hash(params))
    if saved is None:
        raise StepError("the train stage left no checkpoint for these params")
    state = ServerState.from_dict(saved["state"])
    rounds = list(csv.DictReader((copied / "rounds.csv").open()))
    sites = json.loads((copied / "sites.json").read_text())["sites"]
    env = stack.client_env()
    os.environ.update({k: env[k] for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")})
    client = MlflowClient(MLFLOW_URI)
    experiment = client.get_experiment_by_name(PARAMS["tracking"]["experiment"])
    runs = client.search_runs(
        [experiment.experiment_id] if experiment else [],
        f"tags.prefect_flow_run_id = '{flow_run_id}'",
    )
    [run_info] = [r.info for r in runs] or [None]
    versions = client.search_model_versions(f"run_id = '{run_info.run_id}'") if run_info else []
    simulated = simulated_vector(params, work / "sites", medmnist_root)
    diff = float((state.global_vector - simulated).abs().max())
    RECORD["max_abs_diff_vs_simulation"] = diff
    answered = {
        (row["round"], row["client"]) for row in state.trail if row["reason"] not in UNANSWERED
    }
    logs = {
        "sites": stack("logs", "--no-color", *SITES, sites=True).stdout,
        "hub": stack(
            "logs", "--no-color", "worker", "superlink", "mlflow", "prefect-server"
        ).stdout,
    }
    in_image = set(
        run(["docker", "run", "--rm", "--entrypoint", "python", SITE_IMAGE, "-c", FIND_DATA]).stdout.split()
    )  # fmt: skip
    federation = work / "federation"
    mounts, visible = {}, {}
    for name in SITES:
        container = stack.container(name, sites=True)
        inspected = json.loads(run(["docker", "inspect", container]).stdout)[0]
        mounts[name] = [(m["Source"], m["Destination"], m["RW"]) for m in inspected["Mounts"]]
        found = run(["docker", "exec", container, "python", "-c", FIND_DATA]).stdout.split()
        visible[name] = sorted(set(found) - in_image)  # beyond what the image itself holds
    rounds_wanted = params.train.rounds
    check([
        ("the flow run's own MLflow run finished on the server, its model registered",
         run_info is not None and run_info.status == "FINISHED" and len(versions) == 1,
         f"{[r.info.status for r in runs]}, {versions}"),
        (f"{rounds_wanted} rounds in the checkpoint and rounds.csv",
         state.round == rounds_wanted and len(rounds) == rounds_wanted, f"{state.round}, {len(rounds)}"),
        ("every site answered every round", len(answered) == rounds_wanted * len(SITES), str(sorted(answered))),
        ("each site container's warm trainer answered every exchange (exchanges.jsonl)",
         bool(answers) and all(warm == 1.0 for warm in answers), f"{answers}"),
        ("the sites scored the final model on their own splits (reports/sites.json)",
         len(sites) == len(SITES) and all(float(r["n"]) > 0 for r in sites), str(sites)),
        (f"the sites' model equals the simulation's (max diff {diff:.1e} <= {TOLERANCE:g})",
         diff <= TOLERANCE, f"{diff:.3e}"),
        ("no traceback in any container's log",
         not any("Traceback" in text for text in logs.values()),
         "; ".join(text[text.find("Traceback"):][:1500] for text in logs.values() if "Traceback" in text)),
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
    python = run(["docker", "run", "--rm", "--entrypoint", "python", SITE_IMAGE, "-c",
                  "import sys; print(sys.version.split()[0], sys.executable)"]).stdout.strip()  # fmt: skip
    return {"cpu_count": os.cpu_count(), "machine": platform.machine(), "docker": docker,
            "image_python": python, "host_network": host_network()}  # fmt: skip


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
    work = Path(tempfile.mkdtemp(prefix="fedsieve-federation-"))
    os.chmod(work, 0o755)  # the containers' user walks into its folders
    started = time.monotonic()
    try:
        stack = Stack(work, medmnist_root)
        try:
            smoke(work, medmnist_root, stack)
        finally:
            stack.down(work)
    except (StepError, subprocess.TimeoutExpired) as error:
        print(f"federation-smoke: {error}", file=sys.stderr)
        return 1
    finally:
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
