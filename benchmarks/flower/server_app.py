"""Flower ServerApp (Message API): built-in FedAvg over all nodes, the global model
evaluated on the test split after every round (server side, as fedsieve's engine does)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from task import build_model, digest, evaluate, load_split, small_cnn

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    torch.set_num_threads(int(os.environ["FLOWER_RACE_THREADS"]))
    seed = int(os.environ["FLOWER_RACE_SEED"])
    clients = int(os.environ["FLOWER_RACE_CLIENTS"])
    classes = int(os.environ["FLOWER_RACE_CLASSES"])
    images, labels = load_split(Path(os.environ["FLOWER_RACE_DATA"]), "test")
    model = build_model(seed, images.shape[1], classes)
    rounds: list[dict[str, float]] = []

    def central_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        net = small_cnn(images.shape[1], classes)
        net.load_state_dict(arrays.to_torch_state_dict())
        accuracy, loss = evaluate(net, images, labels)
        rounds.append({"round": server_round, "acc": accuracy, "loss": loss, "time": time.time()})
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    strategy = FedAvg(
        fraction_train=1.0,
        fraction_evaluate=0.0,  # no client-side evaluation: fedsieve evaluates centrally
        min_train_nodes=clients,
        min_available_nodes=clients,
    )
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(os.environ["FLOWER_RACE_ROUNDS"]),
        train_config=ConfigRecord({"lr": 0.01, "momentum": 0.9, "batch-size": 32}),
        evaluate_fn=central_evaluate,
    )
    result = {
        "init_digest": digest(list(model.state_dict().values())),
        "rounds": rounds,
    }
    Path(os.environ["FLOWER_RACE_OUT"]).write_text(json.dumps(result, indent=2) + "\n")
