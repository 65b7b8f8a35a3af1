"""A Flower ClientApp as Flower's PyTorch quickstart writes one: the global state dict in,
one local epoch of SGD on the site's file, the new state dict and the example count out;
evaluation on the site's held-out split."""

from __future__ import annotations

from functools import cache

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from federated.data import to_tensors
from flowerapp.site_data import SiteData, load_site_data
from models import build_model

app = ClientApp()


@cache
def site(path: str) -> SiteData:
    return load_site_data(path)


def _model(context: Context, msg: Message) -> tuple[nn.Module, SiteData]:
    data = site(str(context.node_config["data-file"]))
    config = msg.content["config"]
    model = build_model("small_cnn", in_channels=int(config["channels"]),
                        num_classes=int(config["classes"]), image_size=28)  # fmt: skip
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    return model, data


def _tensors(split, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    from federated.data import DatasetInfo

    info = DatasetInfo("site", "multi-class", channels, 2, (), "", "", {}, 28)
    return to_tensors(split, info)


@app.train()
def train(msg: Message, context: Context) -> Message:
    model, data = _model(context, msg)
    images, labels = _tensors(data.train, int(msg.content["config"]["channels"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    for batch in torch.randperm(len(labels)).split(32):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
        loss.backward()
        optimizer.step()
    content = RecordDict({
        "arrays": ArrayRecord(model.state_dict()),
        "metrics": MetricRecord({"num-examples": len(labels), "train_loss": float(loss)}),
    })  # fmt: skip
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    model, data = _model(context, msg)
    images, labels = _tensors(data.test, int(msg.content["config"]["channels"]))
    model.eval()
    with torch.no_grad():
        logits = model(images)
    accuracy = float((logits.argmax(1) == labels).float().mean()) if len(labels) else 0.0
    loss = float(nn.functional.cross_entropy(logits, labels)) if len(labels) else 0.0
    metrics = MetricRecord({"num-examples": len(labels), "accuracy": accuracy, "loss": loss})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
