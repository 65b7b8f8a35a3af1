"""Run by ``.venv-flower/bin/python``: a sequence of aggregates through Flower's own
strategy (``flwr.serverapp.strategy``), the global weights after each round as JSON.

stdin: ``{"strategy": "FedAdam", "params": {...}, "start": [...], "aggregates": [[...], ...]}``
(each aggregate is the round's update; the round's single reply holds ``start + update``
with weight 1, so Flower's weighted mean is that model exactly). stdout: ``[[...], ...]``.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import strategy as strategies


def reply(weights: np.ndarray) -> Message:
    """A training reply carrying ``weights`` and weight 1, as a node would send it."""
    instruction = Message(content=RecordDict(), dst_node_id=1, message_type="train")
    content = RecordDict(
        {"arrays": ArrayRecord({"w": Array(weights)}), "metrics": MetricRecord({"num-examples": 1})}
    )
    return Message(content=content, reply_to=instruction)


def main() -> None:
    spec = json.load(sys.stdin)
    strategy = getattr(strategies, spec["strategy"])(**spec["params"])
    weights = np.asarray(spec["start"], dtype=np.float64)
    trajectory = []
    for server_round, aggregate in enumerate(spec["aggregates"], start=1):
        # what configure_train records before each round: the global model sent out
        if spec["strategy"] == "FedAvgM":
            strategy.current_arrays = strategy.current_arrays or ArrayRecord({"w": Array(weights)})
        else:
            strategy.current_arrays = {"w": weights}
        model = weights + np.asarray(aggregate, dtype=np.float64)
        arrays, _ = strategy.aggregate_train(server_round, [reply(model)])
        weights = arrays["w"].numpy()
        trajectory.append(weights.tolist())
    json.dump(trajectory, sys.stdout)


if __name__ == "__main__":
    main()
