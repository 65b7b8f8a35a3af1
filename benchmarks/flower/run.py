"""Flower's side of the race: ``run_simulation`` (Ray backend) of the ServerApp and
ClientApp here, run with this directory's own environment (benchmarks/.venv-flower).

    benchmarks/.venv-flower/bin/python benchmarks/flower/run.py --data breastmnist.npz \
        --out flower.json [--clients 10] [--rounds 10] [--threads 2] [--seed 0]

Each simulated client gets ``num_cpus=threads`` of a Ray cluster of ``threads`` CPUs,
so clients train one after another, as on the issue's reference run.
"""

from __future__ import annotations

import argparse
import json
import os
import time

STARTED = time.time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--classes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    result_path = args.out + ".server.json"
    log_path = args.out + ".clients.jsonl"
    if os.path.exists(log_path):
        os.remove(log_path)
    os.environ.update(
        FLOWER_RACE_DATA=os.path.abspath(args.data),
        FLOWER_RACE_OUT=os.path.abspath(result_path),
        FLOWER_RACE_LOG=os.path.abspath(log_path),
        FLOWER_RACE_CLIENTS=str(args.clients),
        FLOWER_RACE_ROUNDS=str(args.rounds),
        FLOWER_RACE_THREADS=str(args.threads),
        FLOWER_RACE_CLASSES=str(args.classes),
        FLOWER_RACE_SEED=str(args.seed),
        RAY_DEDUP_LOGS="0",
    )
    import torch
    from flwr.simulation import run_simulation

    torch.set_num_threads(args.threads)
    from client_app import app as client_app
    from server_app import app as server_app

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
    finished = time.time()
    with open(result_path) as handle:
        server = json.load(handle)
    with open(log_path) as handle:
        clients = [json.loads(line) for line in handle]
    report = {
        "started": STARTED,
        "imported": imported,
        "finished": finished,
        "first_client_start": min(c["start"] for c in clients),
        "client_seconds": sum(c["end"] - c["start"] for c in clients),
        **server,
    }
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
