"""Flower's side of a comparison: ``run_simulation`` (Ray backend) of one of this
directory's app pairs, run with Flower's own environment (benchmarks/.venv-flower).

    benchmarks/.venv-flower/bin/python benchmarks/flower/launch.py race \
        --data breastmnist.npz --out flower.json [--clients 10] [--rounds 10] \
        [--threads 2] [--classes 2] [--seed 0]
    benchmarks/.venv-flower/bin/python benchmarks/flower/launch.py cross-device \
        --data lr-mnist.npz --out flower.json [--clients 1000] [--per-round 10] \
        [--rounds 100] [--threads 2] [--batch 10] [--lr 0.05]

``race``: the ServerApp and ClientApp of server_app.py and client_app.py (the Flower
race, benchmarks/speed/flower_race.py); ``cross-device``: those of xdevice_apps.py
(benchmarks/speed/cross_device.py). The apps read their settings from the environment
(``FLOWER_RACE_*``, ``XDEVICE_*``). Each simulated client gets ``num_cpus=threads`` of a
Ray cluster of ``threads`` CPUs, so clients train one after another, as on the reference
runs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

STARTED = time.time()

# The apps' environment prefix, and the settings each takes beyond the common ones.
RACE = {"clients": (int, 10), "rounds": (int, 10), "classes": (int, 2)}
CROSS_DEVICE = {
    "clients": (int, 1000),
    "per-round": (int, 10),
    "rounds": (int, 100),
    "batch": (int, 10),
    "lr": (float, 0.05),
}
APPS: dict[str, tuple[str, dict[str, tuple[type, Any]]]] = {
    "race": ("FLOWER_RACE_", RACE),
    "cross-device": ("XDEVICE_", CROSS_DEVICE),
}


def parsed() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    apps = parser.add_subparsers(dest="app", required=True)
    for name, (_, settings) in APPS.items():
        app = apps.add_parser(name)
        app.add_argument("--data", required=True)
        app.add_argument("--out", required=True)
        app.add_argument("--threads", type=int, default=2)
        app.add_argument("--seed", type=int, default=0)
        for setting, (kind, default) in settings.items():
            app.add_argument(f"--{setting}", type=kind, default=default)
    return parser.parse_args()


def main() -> None:
    args = parsed()
    prefix, settings = APPS[args.app]
    server_out = Path(args.out + ".server.json").absolute()
    client_log = Path(args.out + ".clients.jsonl").absolute()
    client_log.unlink(missing_ok=True)
    names = ["threads", "seed", *(s.replace("-", "_") for s in settings)]
    os.environ.update(
        {f"{prefix}{name.upper()}": str(getattr(args, name)) for name in names}
        | {f"{prefix}DATA": os.path.abspath(args.data), f"{prefix}OUT": str(server_out)}
        | {f"{prefix}LOG": str(client_log), "RAY_DEDUP_LOGS": "0"}
    )
    import torch
    from flwr.simulation import run_simulation

    torch.set_num_threads(args.threads)
    if args.app == "race":
        from client_app import app as client_app
        from server_app import app as server_app
    else:
        from xdevice_apps import client_app, server_app

    imported = time.time()
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=args.clients,
        backend_config={
            "client_resources": {"num_cpus": args.threads, "num_gpus": 0.0},
            "init_args": {"num_cpus": args.threads, "num_gpus": 0},
        },
    )
    report = {"started": STARTED, "imported": imported, "finished": time.time()}
    report |= client_times(client_log) | json.loads(server_out.read_text())
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


def client_times(log: Path) -> dict[str, float]:
    """When the first client started and the clients' summed training seconds, from the
    apps' per-client log (the race's apps write one; the cross-device ones do not)."""
    if not log.exists():
        return {}
    clients = [json.loads(line) for line in log.read_text().splitlines() if line]
    return {
        "first_client_start": min(c["start"] for c in clients),
        "client_seconds": sum(c["end"] - c["start"] for c in clients),
    }


if __name__ == "__main__":
    main()
