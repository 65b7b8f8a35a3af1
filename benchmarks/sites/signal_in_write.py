"""Benchmark: Ctrl-C or SIGTERM landing inside a write to a SQLite MLflow store, many times.

    python -m benchmarks.sites.signal_in_write [--trials 1000] [--per-process 100] [--limit-s 5400]
    python -m benchmarks.sites.signal_in_write --pinned

The trial loop of tests/tasks/test_tracking.py's
``test_a_run_stopped_halfway_through_a_write_to_sqlite_is_still_closed_killed`` (20 trials
there) at a benchmark's size: each trial opens a run, logs metrics step after step, and a
timer signal whose handler raises (``KeyboardInterrupt``, as Ctrl-C does, on even trials;
``SystemExit(143)``, as the ``fedsieve`` command's SIGTERM handler does, on odd ones)
stops it 0.02-0.3 s in, inside ``Tracker.ended_on_failure``; the run must end KILLED. The
trials run in processes of ``--per-process`` trials each (one store each, as in the test),
each under the time left of ``--limit-s``; a process that overruns counts its unfinished
trials as failed. Recorded: the statuses, where each stop landed (the innermost frame of
its traceback) and how long each close took.

``--pinned`` reproduces the cause on purpose: one trial per stop kind with the signal sent
at the moment SQLAlchemy's ORM starts loading the rows of the SELECT a metric's write
makes (a trace function watching for SQLAlchemy's ``_instance_processor``: an internal
name, so this is a reproduction to run by hand, not a test). Before the fix the stop
landed there, left the SELECT's cursor open, and the close failed after SQLite's 20 s
busy timeout.

Writes ``benchmarks/results/signal-in-write.json`` (``signal-in-write-pinned.json``).
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from config.environment import TELEMETRY_OFF

REPO = Path(__file__).resolve().parents[2]

# The test's loop, with what a benchmark records beside the statuses.
TRIALS = """
import itertools, json, random, signal, sys, time
from mlflow import MlflowClient
from tasks.tracking import Tracker

STOPS = (KeyboardInterrupt, lambda: SystemExit(143))  # Ctrl-C; the fedsieve SIGTERM handler
sent = 0.0

def interrupt(signum, frame):
    global sent
    sent = time.monotonic()
    raise STOPS[trial % 2]()

uri, trials, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
delays = random.Random(seed)
signal.signal(signal.SIGALRM, interrupt)
for trial in range(trials):
    tracker = Tracker("interrupted", uri)
    tracker.start(run_id=None, run_name="r", tags={})
    delay = delays.uniform(0.02, 0.3)
    signal.setitimer(signal.ITIMER_REAL, delay)
    give_up = time.monotonic() + delay + 5
    landed = ""
    try:
        with tracker.ended_on_failure():
            for step in itertools.count():
                tracker.log_metrics({"test_acc": 0.5, "test_auc": 0.5}, step=step)
                if time.monotonic() > give_up:  # the signal landed in a finalizer,
                    sent = time.monotonic()  # which swallows what it raises
                    raise KeyboardInterrupt
    except (KeyboardInterrupt, SystemExit) as stop:
        tb = stop.__traceback__
        while tb is not None:  # the last frame before the handler's: where it landed
            if tb.tb_frame.f_code is not interrupt.__code__:
                landed = tb.tb_frame.f_code.co_filename
            tb = tb.tb_next
    closed_s = time.monotonic() - sent
    status = MlflowClient(uri).get_run(tracker.run_id).info.status
    print(json.dumps({"status": status, "landed": landed, "close_s": round(closed_s, 3),
                      "failed": tracker.failed}), flush=True)
"""

# One trial per stop kind, the signal sent when the ORM starts loading a SELECT's rows.
PINNED = """
import json, signal, sys, threading, time
from mlflow import MlflowClient
from tasks.tracking import Tracker

uri = sys.argv[1]
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
for sent in (signal.SIGINT, signal.SIGTERM):
    armed = False

    def tracer(frame, event, arg):
        global armed
        if armed and event == "call" and frame.f_code.co_name == "_instance_processor":
            armed = False
            signal.raise_signal(sent)
            time.sleep(0.05)  # the main thread takes the signal while the write is here
        return None

    tracker = Tracker("pinned", uri)
    tracker.start(run_id=None, run_name="r", tags={})
    tracker.log_metrics({"test_acc": 0.5}, step=0)
    start = time.monotonic()
    try:
        with tracker.ended_on_failure():
            armed = True
            sys.settrace(tracer)
            threading.settrace(tracer)
            try:
                tracker.log_metrics({"test_acc": 0.5}, step=1)
            finally:
                sys.settrace(None)
                threading.settrace(None)
    except (KeyboardInterrupt, SystemExit):
        pass
    status = MlflowClient(uri).get_run(tracker.run_id).info.status
    print(json.dumps({"signal": signal.Signals(sent).name, "sent": not armed, "status": status,
                      "close_s": round(time.monotonic() - start, 2), "failed": tracker.failed}))
"""


def environment() -> dict[str, str]:
    env = {**os.environ, **TELEMETRY_OFF, "PYTHONPATH": str(REPO)}
    env.setdefault("PREFECT_HOME", str(REPO / ".prefect"))
    return env


def run_trials(trials: int, seed: int, limit_s: float, folder: Path) -> list[dict[str, Any]]:
    """One process of ``trials`` trials on a store of its own; those it did not finish
    within ``limit_s`` come back as ``{"status": "UNFINISHED"}``."""
    uri = f"sqlite:///{folder / f'mlflow-{seed}.db'}"
    command = [sys.executable, "-c", TRIALS, uri, str(trials), str(seed)]
    try:
        done = subprocess.run(
            command, cwd=REPO, env=environment(), capture_output=True, text=True,
            timeout=max(limit_s, 1),
        )  # fmt: skip
        out, code = done.stdout, done.returncode
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout
        out, code = out or "", "timeout"
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if code != 0:
        print(f"trial process (seed {seed}) ended with {code}", file=sys.stderr)
    return rows + [{"status": "UNFINISHED"}] * (trials - len(rows))


def where(path: str) -> str:
    """A stop's landing place, by module: the tracker's own code, or a library's."""
    if "site-packages/" in path:
        return path.split("site-packages/")[1].split("/")[0]
    return str(Path(path).resolve().relative_to(REPO)) if path.startswith(str(REPO)) else path


def trials_report(args: argparse.Namespace) -> dict[str, Any]:
    start = time.monotonic()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="signal-in-write-") as folder:
        for seed in range(0, args.trials, args.per_process):
            left = args.limit_s - (time.monotonic() - start)
            batch = min(args.per_process, args.trials - seed)
            rows += run_trials(batch, seed, left, Path(folder))
            failed = sum(row["status"] != "KILLED" for row in rows)
            print(f"{len(rows)} trials, {failed} not KILLED", flush=True)
    statuses = collections.Counter(row["status"] for row in rows)
    return {
        "trials": len(rows),
        "killed": statuses["KILLED"],
        "not_killed": len(rows) - statuses["KILLED"],
        "statuses": dict(statuses),
        "close_failures": sorted({row["failed"] for row in rows if row.get("failed")}),
        "close_s_max": max((row["close_s"] for row in rows if "close_s" in row), default=None),
        "landed_in": dict(collections.Counter(where(row["landed"]) for row in rows if "landed" in row).most_common()),
        "wall_s": round(time.monotonic() - start, 1),
    }  # fmt: skip


def pinned_report() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="signal-in-write-") as folder:
        uri = f"sqlite:///{Path(folder) / 'mlflow.db'}"
        done = subprocess.run(
            [sys.executable, "-c", PINNED, uri], cwd=REPO, env=environment(),
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if len(rows) != 2:
        raise SystemExit(f"the pinned trials did not report:\n{done.stderr[-3000:]}")
    return {"pinned": rows}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--per-process", type=int, default=100)
    parser.add_argument("--limit-s", type=float, default=5400, help="for all trials together")
    parser.add_argument("--pinned", action="store_true", help="the reproduction of the cause")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import mlflow
    import sqlalchemy

    report: dict[str, Any] = {
        "benchmark": "signal-in-write",
        "command": " ".join(["python -m benchmarks.sites.signal_in_write", *(argv or sys.argv[1:])]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": {"kind": "cpu", "nproc": len(os.sched_getaffinity(0)),
                   "platform": platform.platform(), "load_start": os.getloadavg()[0]},
        "versions": {"python": platform.python_version(), "mlflow": mlflow.__version__,
                     "sqlalchemy": sqlalchemy.__version__},
    }  # fmt: skip
    report |= pinned_report() if args.pinned else trials_report(args)
    name = "signal-in-write-pinned.json" if args.pinned else "signal-in-write.json"
    out = args.out or REPO / "benchmarks" / "results" / name
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k not in ("device", "versions")}))
    return report


if __name__ == "__main__":
    main()
