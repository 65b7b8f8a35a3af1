"""Flower's ServerApp and ClientApp for the cross-device benchmark (run by
``launch.py cross-device`` in benchmarks/.venv-flower).

FLUTE's LR-MNIST shape: ``--clients`` supernodes, ``--per-round`` of them train each
round, logistic regression, one local epoch of plain SGD. The built-in FedAvg samples
the nodes that train; which partition each trains is sent in its message, and is the
partition fedsieve's engine samples for that round (``federated.seeding.sample_clients``),
so both sides train the same clients on the same batches (the engine's batch order) from
the same initial weights, and evaluate the global model on the test split after every
round, on the server.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from task import SHUFFLE, derive_seed, digest, evaluate, iid_partition, load_split, train

from federated.seeding import sample_clients, seeded_init
from models import build_model


def settings() -> dict[str, int]:
    keys = ("clients", "per_round", "rounds", "threads", "seed", "batch")
    return {key: int(os.environ[f"XDEVICE_{key.upper()}"]) for key in keys}


def logreg() -> torch.nn.Module:
    return build_model("logreg", in_channels=1, num_classes=10)


@cache
def partitions() -> tuple[torch.Tensor, torch.Tensor, list[object]]:
    """The training split and its IID partition, loaded once per process."""
    images, labels = load_split(Path(os.environ["XDEVICE_DATA"]), "train")
    parts = iid_partition(labels.numpy(), settings()["clients"], settings()["seed"])
    return images, labels, parts


client_app = ClientApp()


@client_app.train()
def train_fn(msg: Message, context: Context) -> Message:
    config = msg.content["config"]
    torch.set_num_threads(settings()["threads"])
    images, labels, parts = partitions()
    client = int(config["partition"])
    index = torch.from_numpy(parts[client])
    model = logreg()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    loss = train(
        model, images[index], labels[index],
        seed=derive_seed(settings()["seed"], int(config["server-round"]), client, SHUFFLE),
        epochs=1, lr=float(config["lr"]), momentum=0.0, batch_size=int(config["batch-size"]),
    )  # fmt: skip
    return Message(
        content=RecordDict({
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord({"train_loss": loss, "num-examples": len(index)}),
        }),
        reply_to=msg,
    )  # fmt: skip


class SameClientsFedAvg(FedAvg):
    """Flower's FedAvg, with the engine's sampled partitions sent to the sampled nodes."""

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        messages = list(super().configure_train(server_round, arrays, config, grid))
        run = settings()
        chosen = sample_clients(run["seed"], server_round, run["clients"], run["per_round"])
        out = []
        for message, partition in zip(messages, chosen, strict=True):
            own = ConfigRecord({**dict(message.content["config"]), "partition": partition})
            content = RecordDict({"arrays": message.content["arrays"], "config": own})
            out.append(
                Message(content=content, message_type=MessageType.TRAIN,
                        dst_node_id=message.metadata.dst_node_id)
            )  # fmt: skip
        return out


server_app = ServerApp()


@server_app.main()
def server_main(grid: Grid, context: Context) -> None:
    run = settings()
    torch.set_num_threads(run["threads"])
    images, labels = load_split(Path(os.environ["XDEVICE_DATA"]), "test")
    model = seeded_init(run["seed"], logreg)
    rounds: list[dict[str, float]] = []

    def central_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        net = logreg()
        net.load_state_dict(arrays.to_torch_state_dict())
        accuracy, loss = evaluate(net, images, labels)
        rounds.append({"round": server_round, "acc": accuracy, "loss": loss, "time": time.time()})
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    strategy = SameClientsFedAvg(
        fraction_train=run["per_round"] / run["clients"],
        fraction_evaluate=0.0,
        min_train_nodes=run["per_round"],
        min_available_nodes=run["clients"],
    )
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=run["rounds"],
        train_config=ConfigRecord(
            {"lr": float(os.environ["XDEVICE_LR"]), "batch-size": run["batch"]}
        ),
        evaluate_fn=central_evaluate,
    )
    result = {"init_digest": digest(list(model.state_dict().values())), "rounds": rounds}
    Path(os.environ["XDEVICE_OUT"]).write_text(json.dumps(result) + "\n")
