"""Where a test run's CPU time goes, by kind of process (docs/architecture.md's figures).

``python scripts/cpu_by_process.py sample --pid PID --out cpu.json`` reads every process's
CPU time (user + system, from ``/proc/<pid>/stat``) every ``--every`` seconds until PID
(``make test``'s) exits, keeping each process's last reading and its command. A process
that lives shorter than one interval is missed, one that ends between two readings loses
what it used since the last: the figures are a lower bound, closest for long-lived servers.

``python scripts/cpu_by_process.py report cpu.json --under DIR`` sums the processes whose
command names DIR (the clone under test) by kind, largest first.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections import Counter
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
KINDS = [  # the first pattern a command matches names its kind
    ("setup (pip, compileall)", r"/pip |ensurepip|compileall"),
    ("Prefect servers", r"prefect\.server|prefect server"),
    ("MLflow servers and their job runners", r"mlflow server|mlflow\.server|huey|scoring_server"),
    ("Flower ClientApps (one per message)", r"flwr-clientapp"),
    ("Flower ServerApps (one per hub run)", r"flwr-serverapp"),
    ("SuperLinks", r"flower-superlink|flowerapp\.superlink"),
    ("SuperNodes and their SuperExecs", r"flower-supernode|flower-superexec"),
    ("warm trainers", r"flowerapp\.trainer"),
    ("fedsieve-site", r"fedsieve-site"),
    ("flwr CLI", r"/flwr "),
    ("Prefect workers and their flow runs", r"prefect\.engine|prefect worker"),
    ("fedsieve commands (stages, CLI, DVC)", r"fedsieve|/dvc "),
    ("pytest workers (in-process tests)", r"pytest|-c import sys;exec"),
]


def read_processes() -> dict[str, tuple[float, str]]:
    """Each live process, keyed by pid and start time: its CPU seconds and command."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after the command name in parentheses
        cpu = (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime
        found[f"{entry}:{fields[19]}"] = (cpu, command.decode(errors="replace").strip())
    return found


def sample(pid: int, out: Path, every: float) -> None:
    """Readings until ``pid`` exits; a zombie's command is empty, so the last one seen is kept.
    Processes alive at the start count only what they use from then on."""
    first = {key: cpu for key, (cpu, _) in read_processes().items()}
    seen: dict[str, tuple[float, str]] = {}
    while Path(f"/proc/{pid}").exists():
        for key, (cpu, command) in read_processes().items():
            known = seen.get(key, (0.0, ""))[1]
            seen[key] = (cpu - first.get(key, 0.0), command or known)
        out.write_text(json.dumps(seen))
        time.sleep(every)


def kind_of(command: str) -> str:
    return next((name for name, pattern in KINDS if re.search(pattern, command)), "other")


def report(readings: Path, under: str) -> list[str]:
    seen = json.loads(readings.read_text())
    seconds: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for cpu, command in seen.values():
        if under in command:
            kind = kind_of(command)
            seconds[kind] += cpu
            count[kind] += 1
    total = sum(seconds.values()) or 1.0
    lines = [
        f"{cpu:7.0f} s {100 * cpu / total:5.1f} % {count[kind]:5d} processes  {kind}"
        for kind, cpu in seconds.most_common()
    ]
    return [*lines, f"{sum(seconds.values()):7.0f} s in all"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sampling = commands.add_parser("sample", help="read CPU times until a process exits")
    sampling.add_argument("--pid", type=int, required=True, help="sample until this exits")
    sampling.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    sampling.add_argument("--every", type=float, default=2.0, help="seconds between readings")
    reporting = commands.add_parser("report", help="sum a sample's CPU time by kind")
    reporting.add_argument("readings", type=Path, help="what `sample` wrote")
    reporting.add_argument("--under", default="", help="count only commands naming this path")
    args = parser.parse_args()
    if args.command == "sample":
        sample(args.pid, args.out, args.every)
    else:
        print("\n".join(report(args.readings, args.under)))


if __name__ == "__main__":
    main()
