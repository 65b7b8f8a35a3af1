"""Flower's side of the cross-device benchmark: ``run_simulation`` (Ray backend) of the
apps in ``xdevice_apps.py``, with this directory's environment (benchmarks/.venv-flower).

    benchmarks/.venv-flower/bin/python benchmarks/flower/run_cross_device.py \
        --data lr-mnist.npz --out flower.json [--clients 1000] [--per-round 10] \
        [--rounds 100] [--threads 2] [--batch 10] [--lr 0.05]

Each simulated client gets ``num_cpus=threads`` of a Ray cluster of ``threads`` CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

STARTED = time.time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    result_path = args.out + ".server.json"
    os.environ.update(
        XDEVICE_DATA=os.path.abspath(args.data), XDEVICE_OUT=os.path.abspath(result_path),
        XDEVICE_CLIENTS=str(args.clients), XDEVICE_PER_ROUND=str(args.per_round),
        XDEVICE_ROUNDS=str(args.rounds), XDEVICE_THREADS=str(args.threads),
        XDEVICE_SEED=str(args.seed), XDEVICE_BATCH=str(args.batch), XDEVICE_LR=str(args.lr),
        RAY_DEDUP_LOGS="0",
    )  # fmt: skip
    from flwr.simulation import run_simulation
    from xdevice_apps import client_app, server_app

    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=args.clients,
        backend_config={
            "client_resources": {"num_cpus": args.threads, "num_gpus": 0.0},
            "init_args": {"num_cpus": args.threads, "num_gpus": 0},
        },
    )
    server = json.loads(Path(result_path).read_text())
    report = {"started": STARTED, "finished": time.time(), **server}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
