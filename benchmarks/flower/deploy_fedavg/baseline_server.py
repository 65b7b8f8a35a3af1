"""Flower's stock FedAvg ServerApp over every connected site, the global model scored on
the hub's test split after each round (as fedsieve's hub does), each round timed."""

from __future__ import annotations

import json
import time
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from federated.data import load_medmnist, to_tensors
from federated.metrics import evaluate
from federated.seeding import seeded_init
from models import build_model

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    channels, classes = int(config["channels"]), int(config["classes"])
    data = load_medmnist(str(config["dataset"]), Path(str(config["data-root"])))
    test = to_tensors(data.test, data.info)
    model = seeded_init(
        0, lambda: build_model("small_cnn", in_channels=channels, num_classes=classes)
    )
    sites = len(list(grid.get_node_ids()))
    rounds: list[dict[str, float]] = []
    started = time.monotonic()

    def central(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        scores = evaluate(model, *test, multi_label=False)
        rounds.append({"round": server_round, "elapsed_s": time.monotonic() - started, **scores})
        return MetricRecord({"accuracy": scores["acc"]})

    FedAvg(min_train_nodes=sites, min_evaluate_nodes=sites, min_available_nodes=sites).start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(config["rounds"]),
        train_config=ConfigRecord({"channels": channels, "classes": classes}),
        evaluate_config=ConfigRecord({"channels": channels, "classes": classes}),
        evaluate_fn=central,
    )
    Path(str(config["out"])).write_text(json.dumps({"sites": sites, "rounds": rounds}) + "\n")
