"""Flower ClientApp (Message API): one local epoch of SGD on the node's IID partition,
shuffled by the (round, client) seed fedsieve's engine uses."""

from __future__ import annotations

import json
import os
import time
from functools import cache
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from task import SHUFFLE, derive_seed, iid_partition, load_split, small_cnn, train

app = ClientApp()


@cache
def partition(partition_id: int, num_partitions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This node's training data, loaded once per actor process."""
    images, labels = load_split(Path(os.environ["FLOWER_RACE_DATA"]), "train")
    seed = int(os.environ["FLOWER_RACE_SEED"])
    index = torch.from_numpy(iid_partition(labels.numpy(), num_partitions, seed)[partition_id])
    return images[index], labels[index]


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    started = time.time()
    torch.set_num_threads(int(os.environ["FLOWER_RACE_THREADS"]))
    partition_id = int(context.node_config["partition-id"])
    images, labels = partition(partition_id, int(context.node_config["num-partitions"]))
    server_round = int(msg.content["config"]["server-round"])
    model = small_cnn(images.shape[1], int(os.environ["FLOWER_RACE_CLASSES"]))
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    loss = train(
        model,
        images,
        labels,
        seed=derive_seed(int(os.environ["FLOWER_RACE_SEED"]), server_round, partition_id, SHUFFLE),
        epochs=1,
        lr=float(msg.content["config"]["lr"]),
        momentum=float(msg.content["config"]["momentum"]),
        batch_size=int(msg.content["config"]["batch-size"]),
    )
    with open(os.environ["FLOWER_RACE_LOG"], "a") as log:
        line = {"round": server_round, "client": partition_id, "start": started, "end": time.time()}
        log.write(json.dumps(line) + "\n")
    content = RecordDict(
        {
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord({"train_loss": loss, "num-examples": len(labels)}),
        }
    )
    return Message(content=content, reply_to=msg)
