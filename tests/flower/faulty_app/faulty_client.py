"""fedsieve's ClientApp, with the fault named by the site's ``fault`` node config applied to
its train replies: ``nan`` (every value NaN), ``shape`` (one value short), ``count`` (ten
times its sample count reported), ``lineage`` (a lineage record without its counts); and ``diverged`` to its evaluate messages: it scores a
global model whose every weight is float32's largest (finite weights, non-finite outputs,
as a diverged training leaves them). Sites without one answer as fedsieve's ClientApp
does."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord
from flwr.clientapp import ClientApp

from flowerapp import client_app as site
from flowerapp.remote import vector_record

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    reply = site.train(msg, context)
    fault = str(context.node_config.get("fault", ""))
    if not fault or not reply.has_content():
        return reply
    vector = np.array(reply.content["update"]["vector"].numpy())
    metrics = dict(reply.content["metrics"])
    if fault == "nan":
        vector = np.full_like(vector, np.nan)
    elif fault == "shape":
        vector = vector[:-1]
    elif fault == "count":
        metrics["num_samples"] = int(metrics["num_samples"]) * 10
    elif fault == "lineage":
        reply.content["lineage"] = ConfigRecord({"data_sha256": "not a digest"})
    reply.content["update"] = vector_record(torch.from_numpy(vector))
    reply.content["metrics"] = MetricRecord(metrics)
    return reply


@app.evaluate()
def score(msg: Message, context: Context) -> Message:
    if str(context.node_config.get("fault", "")) == "diverged":
        vector = np.array(msg.content["global"]["vector"].numpy())
        huge = np.full_like(vector, np.finfo(np.float32).max)
        msg.content["global"] = vector_record(torch.from_numpy(huge))
    return site.score(msg, context)
