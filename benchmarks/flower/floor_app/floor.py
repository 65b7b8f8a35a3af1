"""Flower's own floor for a round: every connected node gets a vector of the model's size
and echoes it at once (a ClientApp that does no work), ``rounds`` times. The hub pushes
and pulls as fedsieve's ServerApp does (``push_messages``, then ``pull_messages`` every
0.2 s), so the rounds differ from fedsieve's only by the work fedsieve does in them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

PULL_INTERVAL_S = 0.2  # as flowerapp.remote's
DEADLINE_S = 600.0  # a node that never answers ends the round (its reply not counted)
server = ServerApp()
client = ClientApp()


@client.train()
def echo(msg: Message, context: Context) -> Message:
    return Message(RecordDict({"vector": msg.content["vector"]}), reply_to=msg)


def one_round(grid: Grid, nodes: list[int], record: ArrayRecord, round_number: int) -> int:
    """Seconds are the caller's; the number of replies."""
    messages = [
        Message(RecordDict({"vector": record}), dst_node_id=node, message_type="train",
                group_id=str(round_number))
        for node in nodes
    ]  # fmt: skip
    waiting = set(grid.push_messages(messages))
    replies, deadline = 0, time.monotonic() + DEADLINE_S
    while waiting and time.monotonic() < deadline:
        pulled = list(grid.pull_messages(waiting))
        replies += len(pulled)
        waiting -= {reply.metadata.reply_to_message_id for reply in pulled}
        if waiting:
            time.sleep(PULL_INTERVAL_S)
    return replies


@server.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    vector = np.zeros(int(config["floats"]), dtype=np.float32)
    record = ArrayRecord({"v": Array(vector)})
    nodes = sorted(grid.get_node_ids())
    rounds = []
    for round_number in range(1, int(config["rounds"]) + 1):
        started = time.perf_counter()
        replies = one_round(grid, nodes, record, round_number)
        rounds.append({"round": round_number, "seconds": time.perf_counter() - started,
                       "replies": replies})  # fmt: skip
    result = {"sites": len(nodes), "floats": vector.size, "rounds": rounds}
    Path(str(config["out"])).write_text(json.dumps(result) + "\n")
