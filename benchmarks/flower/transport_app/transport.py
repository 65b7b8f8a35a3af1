"""A vector of ``megabytes`` float32 values sent to every site and echoed back: what the
transport carries for a large model in one round (both directions), timed and checked."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

server = ServerApp()
client = ClientApp()


@client.train()
def echo(msg: Message, context: Context) -> Message:
    return Message(RecordDict({"vector": msg.content["vector"]}), reply_to=msg)


@server.main()
def main(grid: Grid, context: Context) -> None:
    size = int(float(context.run_config["megabytes"]) * 1e6 / 4)
    vector = np.random.default_rng(0).standard_normal(size, dtype=np.float32)
    nodes = list(grid.get_node_ids())[:2]  # two sites: ~0.4 GB through the SuperLink
    record = ArrayRecord({"v": Array(vector)})
    messages = [
        Message(RecordDict({"vector": record}), dst_node_id=n, message_type="train") for n in nodes
    ]
    started = time.perf_counter()
    replies = list(grid.send_and_receive(messages, timeout=600))
    seconds = time.perf_counter() - started
    equal = [
        r.has_content() and np.array_equal(r.content["vector"]["v"].numpy(), vector)
        for r in replies
    ]
    result = {"megabytes": vector.nbytes / 1e6, "sites": len(nodes), "replies": len(replies),
              "round_trip_s": seconds, "echoed_intact": bool(equal) and all(equal)}  # fmt: skip
    Path(str(context.run_config["out"])).write_text(json.dumps(result) + "\n")
