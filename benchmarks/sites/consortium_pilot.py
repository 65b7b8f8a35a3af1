"""Benchmark: the docs' recommended 3-site defence against a label-flipping hospital, at
real sites on 127.0.0.1, followed from docs/federation.md's three-hospital pilot.

    .venv/bin/python -m benchmarks.sites.consortium_pilot [--seeds 10] [--rounds 5]

Per seed, the pilot's commands as docs/federation.md gives them: ``fedsieve sites``
writes three folders of BreastMNIST PNGs (a fifth of each held out, the seed's IID
split); hospital-c then reverses every training label in its ``labels.csv`` (its held-out
rows keep theirs, as a flipper's own split does in the simulated grid); each site makes
its key pair (``python -m flowerapp.certs --no-tls --site``); the hub's SuperLink
(``python -m flowerapp.superlink``, TLS and SuperNode authentication on) and its flwr
connection come from :class:`benchmarks.sites.loopback.Loopback`, which runs the hub's
commands on free ports and stops every process by PID; the hub writes ``pilot.yaml``
(the docs' schema with the recommended 3-site defence and the training settings it was
measured with: :func:`pilot_params`), ``fedsieve plan``; each site's ``fedsieve-site
--check`` prints the count the hub registers (``flwr supernode register``), each site
runs ``fedsieve-site``, and the hub ``fedsieve run --params pilot.yaml``, with no images of
its own. The trail (``reports/exclusions.csv``) says when hospital-c was out and which
honest sites were ever excluded; ``fedsieve explain`` answers for hospital-c in round 3.

The defence is the one the small CNN's record (benchmarks/results/small-consortium-cnn-cpu.json,
python -m benchmarks.robustness.small_consortium --model small_cnn) recommends at 3 sites
(``--defence`` names another of its defences). Record:
``benchmarks/results/consortium-pilot-cpu.json`` (per seed: the round hospital-c was out,
the honest sites excluded, the final pooled test scores, seconds; a rerun adds the seeds
not yet there).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import cpu_environment, write_summary
from benchmarks.robustness.small_consortium import DEFENCES, HELD_OUT
from benchmarks.sites.loopback import CONNECTION, Loopback
from fedsieve.arguments import positive_int
from flowerapp.certs import SiteKey

REPO = Path(__file__).resolve().parents[2]
HUB_BIN = REPO / ".venv" / "bin"
FLOWER_BIN = REPO / ".venv-flower" / "bin"
RESULTS = REPO / "benchmarks" / "results"
RECORD = RESULTS / "consortium-pilot-cpu"
CNN_RECORD = RESULTS / "small-consortium-cnn-cpu.json"
SITES = ("hospital-a", "hospital-b", "hospital-c")
FLIPPER = "hospital-c"  # reverses every training label, as in issue 78's pilot
CLASSES = ["malignant", "normal, benign"]  # BreastMNIST's, in label order
BY_ROUND = 3
COMMAND_TIMEOUT = 1800.0
_SAMPLES = re.compile(r"register samples: (\d+)")


def defence_of(name: str) -> tuple[str, list[dict[str, Any]], float]:
    """A defence of the small consortium's grid: its name, filters and the share each
    site holds out (0 where it holds none out)."""
    if name not in DEFENCES:
        raise SystemExit(
            f"consortium_pilot: --defence {name}: not a defence of the small consortium's "
            f"grid; allowed: {', '.join(DEFENCES)}"
        )
    return name, DEFENCES[name], float(HELD_OUT.get(name, 0.0))


def recommended_at_three(record: Path = CNN_RECORD) -> str:
    """The defence the small CNN's record recommends at 3 sites (the docs' row)."""
    if not record.exists():
        raise SystemExit(
            f"consortium_pilot: {record.name} not found: run python -m "
            "benchmarks.robustness.small_consortium --model small_cnn, or name --defence"
        )
    return str(json.loads(record.read_text())["recommended"]["3"]["defence"])


def pilot_params(
    seed: int, rounds: int, filters: list[dict[str, Any]], sites: list[dict[str, Any]]
) -> dict[str, Any]:
    """docs/federation.md's pilot.yaml (hub step 5) with the seed, the recommended 3-site
    defence in front of the median, and params.yaml's local training settings (what the
    defence was measured with; pilot.yaml's own defaults train one epoch at lr 0.01)."""
    defaults = yaml.safe_load((REPO / "params.yaml").read_text())
    local = {k: defaults["train"][k] for k in ("local_epochs", "lr", "momentum", "weight_decay",
                                                "batch_size")}  # fmt: skip
    return {
        "seed": seed,
        "data": {"dataset": "breast-pilot",
                 "own": {"task": "binary-class", "classes": CLASSES, "channels": 1}},
        "model": defaults["model"],
        "train": {"rounds": rounds, **local},
        "aggregate": {"name": "median"},
        "filters": filters,
        "eval": {"where": "sites"},
        "federation": {"runtime": "flower", "superlink": CONNECTION, "sites": sites},
    }  # fmt: skip


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """One command of the docs, its output; a failure stops the pilot with its output."""
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}"
        )
    return done.stdout + done.stderr


def flip_training_labels(table: Path) -> int:
    """Reverse every training row's label of a site's labels.csv (binary: each to the
    other class); its held-out rows are kept. Returns the rows flipped."""
    with table.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    flipped = 0
    for row in rows:
        if row["split"] == "train":
            row["label"] = CLASSES[len(CLASSES) - 1 - CLASSES.index(row["label"])]
            flipped += 1
    with table.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["file", "label", "split"])
        writer.writeheader()
        writer.writerows(rows)
    return flipped


def outcome(trail: Path) -> dict[str, Any]:
    """From the run's trail: the round hospital-c was first excluded, the honest sites
    ever excluded and the honest site-rounds excluded (client id = place in the sites)."""
    with trail.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    excluded = [(int(r["round"]), SITES[int(r["client"])]) for r in rows
                if r["excluded"] == "True"]  # fmt: skip
    flipper = [t for t, site in excluded if site == FLIPPER]
    honest = [(t, site) for t, site in excluded if site != FLIPPER]
    return {
        "flipper_out_round": min(flipper) if flipper else None,
        "honest_banned": sorted({site for _, site in honest}),
        "honest_site_rounds_excluded": len(honest),
        "rounds_in_trail": max((int(r["round"]) for r in rows), default=0),
    }


def one_seed(seed: int, rounds: int, defence: tuple[str, list[dict[str, Any]], float],
             work: Path) -> dict[str, Any]:  # fmt: skip
    """The pilot once, from an empty folder: its outcome and seconds."""
    started = time.perf_counter()
    name, filters, held_out = defence
    hub_dir, site_dir = work / "hub", work / "site"
    hub_dir.mkdir(parents=True)
    site_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "FLWR_HOME")}
    env |= {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
    hospitals = site_dir / "hospitals"
    run([str(HUB_BIN / "fedsieve"), "sites", "--params", str(REPO / "params.yaml"),
         "--format", "png", "--set", f"partition.local_test={held_out}",
         "--set", "partition.num_clients=3", "--set", f"seed={seed}", "--out", str(hospitals)],
        site_dir, env)  # fmt: skip
    folders = {site: hospitals / f"site-{k}" for k, site in enumerate(SITES)}
    flipped = flip_training_labels(folders[FLIPPER] / "labels.csv")
    keys = {}
    for site in SITES:  # site step 1
        run([str(FLOWER_BIN / "python"), "-m", "flowerapp.certs", "--out", "keys", "--no-tls",
             "--site", site], site_dir, env)  # fmt: skip
        keys[site] = SiteKey(site, site_dir / "keys" / f"{site}.key",
                             site_dir / "keys" / f"{site}.pub")  # fmt: skip
    with Loopback(work / "loopback", bin_dir=FLOWER_BIN) as fed:
        fed.start_superlink()  # hub steps 2-4
        hub_env = env | fed.flwr_env() | {
            "FEDSIEVE_FLOWER_BIN": str(FLOWER_BIN),
            "MEDMNIST_ROOT": str(hub_dir / "no-images-here"),
        }  # fmt: skip
        pilot = hub_dir / "pilot.yaml"
        pilot.write_text(yaml.safe_dump(pilot_params(seed, rounds, filters, []), sort_keys=False))
        plan = hub_dir / "plan.json"
        run([str(HUB_BIN / "fedsieve"), "plan", "--params", str(pilot), "--out", str(plan)],
            hub_dir, hub_env)  # hub step 6  # fmt: skip
        named = []
        for site in SITES:
            command = fed.site_command(keys[site], folders[site], plan)
            said = run([*command, "--check"], site_dir, env)  # site step 3
            samples = int(_SAMPLES.search(said).group(1))  # type: ignore[union-attr]
            node_id = fed.register(keys[site].public)  # hub step 7
            named.append({"name": site, "node_id": node_id, "samples": samples})
            fed.start_site_command(site, command)  # site step 4
        for site in SITES:
            fed.wait_connected(site)
        pilot.write_text(yaml.safe_dump(pilot_params(seed, rounds, filters, named),
                                        sort_keys=False))  # hub step 8  # fmt: skip
        said = run([str(HUB_BIN / "fedsieve"), "run", "--params", str(pilot)], hub_dir, hub_env)
        explained = run([str(HUB_BIN / "fedsieve"), "explain", "--round", str(BY_ROUND),
                         "--site", FLIPPER], hub_dir, hub_env)  # hub step 10  # fmt: skip
    metrics = json.loads((hub_dir / "reports" / "metrics.json").read_text())
    [final] = [line for line in said.splitlines() if "final model:" in line] or [""]
    return {
        "seed": seed, "defence": name, "flipped_training_labels": flipped,
        **outcome(hub_dir / "reports" / "exclusions.csv"),
        "test_auc": metrics.get("test_auc"), "test_acc": metrics.get("test_acc"),
        "final_line": final.strip(), "explain_round_3": explained.strip().splitlines()[:6],
        "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Seeds with hospital-c out by round :data:`BY_ROUND`, and with an honest site banned."""
    return {
        "seeds": len(runs),
        "flipper_out_by_round_3_seeds": sum(
            1 for r in runs if r["flipper_out_round"] and r["flipper_out_round"] <= BY_ROUND
        ),
        "honest_banned_seeds": sum(1 for r in runs if r["honest_banned"]),
    }


def summary_lines(payload: dict[str, Any]) -> list[str]:
    lines = ["| seed | hospital-c out in round | honest sites excluded | final test AUC | seconds |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in payload["runs"]:
        auc = "–" if r["test_auc"] is None else f"{r['test_auc']:.3f}"
        lines.append(f"| {r['seed']} | {r['flipper_out_round'] or 'never'} | "
                     f"{', '.join(r['honest_banned']) or 'none'} | {auc} | {r['seconds']} |")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=positive_int, default=10)
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument(
        "--defence", default=None, choices=list(DEFENCES),
        help="a defence of the small consortium's grid (default: the small CNN's 3-site choice)",
    )  # fmt: skip
    args = parser.parse_args()
    chosen = recommended_at_three() if CNN_RECORD.exists() or not args.defence else None
    defence = defence_of(args.defence or str(chosen))
    path = RECORD.with_suffix(".json")
    previous = json.loads(path.read_text()) if path.exists() else {}
    same = previous.get("settings", {}).get("defence") == defence[0] and previous.get(
        "settings", {}).get("rounds") == args.rounds  # fmt: skip
    runs = list(previous.get("runs", [])) if same else []
    for seed in range(args.seeds):
        if any(r["seed"] == seed for r in runs):
            continue
        with tempfile.TemporaryDirectory(prefix="consortium-pilot-") as work:
            result = one_seed(seed, args.rounds, defence, Path(work))
        print(json.dumps({k: result[k] for k in ("seed", "flipper_out_round", "honest_banned",
                                                 "seconds")}), flush=True)  # fmt: skip
        runs = sorted([*runs, result], key=lambda r: r["seed"])
        write_record(runs, defence, chosen, args.rounds)
    write_record(runs, defence, chosen, args.rounds)  # the recommendation, as now recorded


def write_record(runs: list[dict[str, Any]], defence: tuple[str, list[dict[str, Any]], float],
                 chosen: str | None, rounds: int) -> None:  # fmt: skip
    """The record: the pilot's settings (the defence, and the one the small CNN's record
    recommends at 3 sites now), the seeds' summary and each seed's run."""
    params = pilot_params(0, rounds, [], [])
    payload = {
        "settings": {
            "dataset": "breastmnist", "sites": list(SITES), "flipper": FLIPPER,
            "attack": "every training label reversed", "defence": defence[0],
            "recommended_at_3_sites": chosen, "filters": defence[1], "held_out": defence[2],
            "aggregate": "median", "model": params["model"]["name"], "train": params["train"],
            "rounds": rounds, "by_round": BY_ROUND,
        },
        "summary": summary(runs), "runs": runs,
    } | cpu_environment()  # fmt: skip
    write_summary(RECORD, payload, summary_lines(payload))


if __name__ == "__main__":
    main()
