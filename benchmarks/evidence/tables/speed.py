"""Speed and overhead: what a user waits for beside the training, the Flower race, grid
throughput, cross-device federations, the aggregation rules' and PID-MADE's cost, batched
clients, and the single measurements of the pre-test and the portable-numerics pin."""

from __future__ import annotations

import statistics

from benchmarks.evidence.tables.cells import ratio_check, table
from benchmarks.evidence.tables.records import results_json


def overhead_block() -> str:
    """What a user waits for beside the training (benchmarks/speed/overhead.py)."""
    r = results_json("overhead-cpu")
    run, dvc = r["attribution_fedsieve_run"], r["dvc"]
    goal = run["target_overhead_s"]
    return table(("measure", "figure", "goal"), [
        ("`make run` (`fedsieve dvc repro`: all DVC stages, one Prefect server)",
         f"{dvc['make_run_fedsieve_dvc_repro_s']:.1f} s", "≤ 60 s " + ("✓" if dvc["make_run_fedsieve_dvc_repro_s"] <= 60 else "✗")),
        (f"`fedsieve run` ({r['rounds']} rounds), own temporary server: wall", f"{run['wall_s']:.1f} s", ""),
        ("of which training and evaluation", f"{run['compute_s']:.1f} s", ""),
        ("overhead beside the compute", f"**{run['overhead_s']:.1f} s**", ratio_check(run["overhead_s"], goal, at_most=True)),
        ("the same against an already running Prefect server", f"{run['running_server_wall_s']:.1f} s", ""),
        ("importing torch / Prefect / MLflow / the pipeline's flows",
         " / ".join(f"{r['imports'][k]:.1f} s" for k in ("import_torch_s", "import_prefect_s", "import_mlflow_s", "import_flows.pipeline_s")), ""),
        ("starting a Prefect server", f"{r['prefect']['server_start_s']:.1f} s", ""),
        ("MLflow: store and run created / model logged and registered",
         f"{r['mlflow_tracker']['store_and_run_created']:.1f} s / {r['mlflow_tracker']['log_and_register_model']:.1f} s", ""),
    ])  # fmt: skip


def flower_race_block() -> str:
    """The Flower race (benchmarks/speed/flower_race.py): per contestant, the process's time
    from start to exit and a round's time, medians over the repeats."""
    r = results_json("flower-race-cpu")
    contestants = {f"fedsieve engine ({b})": e for b, e in r["fedsieve_engine"].items()}
    contestants["Flower 1.32 `run_simulation`"] = r["flower"]
    rows = []
    for name, entry in contestants.items():
        runs = entry["runs"]
        flower = "before_first_client_s" in runs[0]
        # Flower's first round also starts Ray's client actors: its rounds from the second on
        rounds = [t for run in runs for t in (run["round_s"][1:] if flower else run["round_s"])]
        before = [run["before_first_client_s" if flower else "startup_s"] for run in runs]
        rows.append((name, f"{statistics.median(run['wall_s'] for run in runs):.2f} s",
                     f"{statistics.median(rounds):.3f} s", f"{statistics.median(before):.2f} s"))  # fmt: skip
    kinds = {"warm": "own server, warm", "running_server": "against a running server"}
    for kind, label in kinds.items():
        walls = r["fedsieve_run"][kind]["walls_s"]
        rows.append((f"`fedsieve run` ({label})", f"{statistics.median(walls):.2f} s "
                     f"({min(walls):.1f}–{max(walls):.1f})", "", ""))  # fmt: skip
    header = ("contestant", "process, start to exit", "a round (median)", "before the first round")
    return table(header, rows) + (
        f"\n{len(runs)} repeats; `flower_over_fedsieve` (processes, the faster engine backend): "
        f"**{r['flower_over_fedsieve']}** by the medians, "
        f"{r['flower_over_fedsieve_min_of_repeats']} by the fastest runs (goal ≥ 4).\n"
    )


def grid_throughput_block() -> str:
    """A comparison grid's cells against the engine alone (benchmarks/speed/grid_throughput.py)."""
    r = results_json("grid-throughput-cpu")
    one, goals = r["one_cell"], r["targets"]
    return table(("measure", "figure", "goal"), [
        ("grid wall time / engine-only wall time for the same cells",
         f"{r['grid_wall_s']} s / {r['engine_only_s']} s = **{r['grid_over_engine']}**",
         ratio_check(r["grid_over_engine"], goals["grid_over_engine"], at_most=True)),
        ("cells per hour", f"**{r['cells_per_hour']}**", ratio_check(r["cells_per_hour"], goals["cells_per_hour"], at_most=False)),
        ("compute floor: training images / best measured local throughput",
         f"{r['compute_floor']['floor_cells_per_hour']} cells/h", ""),
        ("one cell: time beside local training (screen, aggregation, evaluation, tracking)",
         f"{100 * one['beside_training_share_of_training']:.0f} %", "< 30 % " + ("✓" if one["beside_training_share_of_training"] < 0.3 else "✗")),
        *((f"engine only, {k.replace('x', ' cells × ')} thread(s)", f"{v['wall_s']} s ({v['cells_per_hour']} cells/h)", "")
          for k, v in r["engine_only_by_cells_x_threads"].items()),
        *((f"local training images/s, {k.replace('x', ' cells × ')} thread(s)", f"{v:,.0f}", "")
          for k, v in r["local_training_images_per_s"].items()),
    ])  # fmt: skip


RULE_NAMES = {"fedavg": "FedAvg", "ema": "EMA", "krum": "Krum", "multi_krum": "Multi-Krum",
              "fedlag": "FedLag (exact)", "zeno": "Zeno", "bulyan": "Bulyan"}  # fmt: skip


def aggregation_block(device: str) -> str:
    """Per rule, the median time of a call per client count (benchmarks/speed/aggregation.py),
    with the memory floor's multiple and the goal where one was set."""
    r = results_json(f"aggregation-{device}")
    rows = r["results"]
    counts = sorted({row["n"] for row in rows})
    rules = sorted({row["rule"] for row in rows}, key=lambda rule: min(
        row["median_ms"] for row in rows if row["rule"] == rule))  # fmt: skip
    cell = {(row["rule"], row["n"]): row for row in rows}
    goal_n = 50 if 50 in counts else counts[-1]
    out = []
    for rule in rules:
        times = [f"{cell[rule, n]['median_ms']:,.1f}" if (rule, n) in cell else "–" for n in counts]
        at = cell.get((rule, goal_n), {})
        goal = at.get("target_ms")
        check = ratio_check(at["median_ms"], goal, at_most=True) if goal else ""
        floor = f"{at['x_floor']:.1f}×" if at else "–"
        out.append((RULE_NAMES.get(rule, rule.replace("_", " ")), *times, floor, check))
    header = (
        "rule",
        *(f"n = {n} (ms)" for n in counts),
        f"× floor at n = {goal_n}",
        f"goal at n = {goal_n} (ms)",
    )
    return table(header, out)  # fmt: skip


def pid_cost_block() -> str:
    """PID-MADE's scoring cost beside Krum and the geometric median (benchmarks/speed/pid_cost.py)."""
    r = results_json("pid-cost-cpu")

    def ms(value: float) -> str:
        return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.1f} ms"

    rows = [(row["n"], *(ms(row[k]["median_ms"]) for k in ("pid_made", "krum", "geometric_median")))
            for row in r["results"]]  # fmt: skip
    fits = r["fits"]
    rows.append(("log-log slope, n ≥ 20",
                 *(f"{fits[k]['n_ge_20']['loglog_slope']:.2f}" for k in ("pid_made", "krum", "geometric_median"))))  # fmt: skip
    return table(("clients", "PID-MADE", "Krum", "geometric median"), rows)


def site_validation_cost_block() -> str:
    """A round with validation at the sites beside the round without it
    (benchmarks/speed/site_validation_cost.py)."""
    r = results_json("site-validation-cost-cpu")
    s = r["summary"]
    rows = [
        ("round without validation (median)", f"{s['round_without_s']:.2f} s"),
        ("round with validation (median)", f"{s['round_with_s']:.2f} s"),
        ("of which the sites validating (median)", f"{s['validation_s']:.2f} s "
         f"({s['candidate_models']:.0f} candidate models)"),
        ("validation against the rest of its round (median of rounds)",
         f"{s['validation_over_rest']:+.0%}"),
        ("a site's validation message at real sites", f"{s['message_bytes_per_site'] / 1e6:.2f} MB"),
    ]  # fmt: skip
    return f"{r['setup']}; {r['seeds']} seeds × {r['rounds']} rounds each way.\n\n" + table(
        ("", "CPU"), rows
    )


def method_cost_block(device: str) -> str:
    """Each method's round beside FedAvg's on the batched engine, in one run, against
    issue 79's bound (benchmarks/speed/method_cost.py)."""
    r = results_json(f"method-cost-{device}")
    cpu = "cpu_over_fedavg" in r["summary"]["FedAvg"] and device == "cpu"
    rows = []
    for method, s in r["summary"].items():
        row = [method, f"{s['round_s']:.2f} s", f"{s['over_fedavg']:.2f}×"]
        if cpu:
            row += [f"{s['round_cpu_s']:.2f} s", f"{s['cpu_over_fedavg']:.2f}×"]
        # the bound is read off the CPU time where there is one (the work, not the load)
        ratio = s["cpu_over_fedavg"] if cpu else s["over_fedavg"]
        row.append("" if method == "FedAvg" else ratio_check(ratio, r["bound"], at_most=True))
        rows.append(tuple(row))
    header = ("method", "a round (median)", "over FedAvg's round (wall)")
    header += ("CPU time a round (median)", "over FedAvg's (CPU time)") if cpu else ()
    return f"{r['setup']}; {r['rounds']} timed rounds, interleaved.\n\n" + table(
        (*header, "bound"), rows
    )


def round_speed_block(device: str) -> str:
    """Batched against sequential client training (benchmarks/speed/round_speed.py)."""
    r = results_json("round-speed-cuda" if device == "cuda" else "round-speed-cpu-quick")
    cnn = r["small_cnn_round"]
    rows = [(f"small-CNN round, {cnn['clients']} clients, batched vs sequential",
             f"**{cnn['batched']['median_s']} s vs {cnn['sequential']['median_s']} s: {cnn['batched_speedup']}×**",
             f"≥ {cnn['target_speedup_h100']:g}× on an H100 " + ("✓" if cnn["batched_speedup"] >= cnn["target_speedup_h100"] else "✗") if device == "cuda" else "")]  # fmt: skip
    resnet = r.get("resnet18_round_vs_centralized_epoch")
    if resnet:  # the goals were set for an H100
        rows.append(("ResNet-18 batched round vs one centralized epoch",
                     f"**{resnet['batched_round']['median_s']} s vs {resnet['centralized_epoch']['median_s']} s: {resnet['round_over_epoch']}×**",
                     ratio_check(resnet["round_over_epoch"], resnet["target_round_over_epoch"], at_most=True) if device == "cuda" else ""))  # fmt: skip
    memory = r.get("resnet18_100_clients_memory", {})
    if "peak_allocated_gb" in memory or "deltas_gb" in memory:
        rows.append((f"{memory['clients']}-client ResNet-18 batched round: the updates kept",
                     f"{memory['deltas_gb']} GB, {memory['round_s']} s", ""))  # fmt: skip
    return table(("figure", "measured", "goal"), rows)


def speed_notes_block() -> str:
    """The single measurements of the pre-test and the portable-numerics pin."""
    pre, pin = results_json("pretest-cpu"), results_json("portable-numerics")
    pinned, unpinned = pin["results"]["pinned"], pin["results"]["unpinned"]
    return table(("measure", "figure", "goal"), [
        (f"normality pre-test, {pre['n_coords']:,} coordinates × {pre['n_clients']} clients, both tests",
         f"**{pre['seconds']:.1f} s wall**, {pre['cpu_seconds']:.1f} s CPU", ratio_check(pre["seconds"], pre["target_seconds"], at_most=True)),
        ("the default pipeline's round, portable numerics pinned / not pinned (median)",
         f"{pinned['seconds_per_round_median']:.2f} s / {unpinned['seconds_per_round_median']:.2f} s "
         f"({pin['slowdown_median']:.2f}×; best rounds {pin['slowdown_best']:.2f}×)", ""),
        ("weights hashes over the processes, pinned / not pinned",
         f"{len(pinned['weights_sha256'])} / {len(unpinned['weights_sha256'])}", "1 each"),
    ])  # fmt: skip


def cross_device_block(device: str = "cpu") -> str:
    """The cross-device runs (benchmarks/speed/cross_device.py) against their goals: process
    wall time and the rounds' own time, both sides, and the large federations."""
    r = results_json(f"cross-device-{device}")
    lr, goals = r["lr_mnist"], r["targets"]
    rows = [
        ("LR-MNIST shape, fedsieve, process start to exit",
         f"**{lr['fedsieve_s']:.2f} s**", ratio_check(lr["fedsieve_s"], goals["lr_mnist_fedsieve_s"], at_most=True)),
        ("... of which its 100 rounds", f"{lr['fedsieve_rounds_s']:.2f} s", ""),
    ]  # fmt: skip
    if "flower_s" in lr:
        rows += [
            ("LR-MNIST shape, Flower, process start to exit", f"{lr['flower_s']:.2f} s", ""),
            ("... of which its 100 rounds", f"{lr['flower_rounds_s']:.2f} s", ""),
            ("`flower_over_fedsieve` (processes)", f"**{lr['flower_over_fedsieve']:.1f}**",
             ratio_check(lr["flower_over_fedsieve"], goals["flower_over_fedsieve"], at_most=False)),
            ("Flower over fedsieve, the rounds alone", f"{lr['flower_over_fedsieve_rounds']:.1f}", ""),
            ("accuracy, round 1 → 100 (fedsieve / Flower)",
             f"{lr['fedsieve_acc'][0]:.3f} → {lr['fedsieve_acc'][-1]:.3f} / "
             f"{lr['flower_acc'][0]:.3f} → {lr['flower_acc'][-1]:.3f}", ""),
            ("largest accuracy difference in any round", f"{lr['max_abs_acc_difference']:.1g}", "sampling noise"),
        ]  # fmt: skip
    for key, label, goal in (
        ("ten_thousand_clients", "10,000 clients, 50 rounds of 100, small CNN", "ten_thousand"),
        ("hundred_thousand_clients", "100,000 clients, partition + 1 round of 100", "hundred_thousand"),
    ):  # fmt: skip
        if key not in r:
            continue
        run = r[key]
        rows += [
            (f"{label}: process start to exit", f"**{run['wall_s']:.1f} s**",
             ratio_check(run["wall_s"], goals[f"{goal}_wall_s"], at_most=True)),
            ("... partition / rounds", f"{run['partition_s']:.2f} s / {run['rounds_s']:.1f} s", ""),
            ("... peak resident memory", f"{run['peak_rss_gb']:.2f} GB",
             ratio_check(run["peak_rss_gb"], goals[f"{goal}_peak_gb"], at_most=True)),
        ]  # fmt: skip
        if "peak_gpu_gb" in run:
            rows.append(("... peak GPU memory (allocated)", f"{run['peak_gpu_gb']:.2f} GB", ""))
        if "floor" in run:
            floor = run["floor"]
            rows += [
                ("... its 50 rounds' arithmetic at this CPU's best measured rate "
                 f"({floor['gflop_per_s']:g} GFLOP/s, a {floor['scoring_gflop']:g}-GFLOP scoring pass)",
                 f"{floor['fifty_rounds_floor_s']:.1f} s", ""),
                (f"... the same, each client's step timed alone ({1000 * floor['client_step_s']:.1f} ms, "
                 f"{floor['client_step_gflop_per_s']:g} GFLOP/s)",
                 f"{floor['fifty_rounds_client_by_client_s']:.1f} s", ""),
            ]  # fmt: skip
    return table(("measure", "figure", "goal"), rows)


def cross_device_profile_block() -> str:
    """Where a cross-device run's time goes, by phase (cProfile, benchmarks/speed/cross_device.py)."""
    profiles = results_json("cross-device-cpu")["profile"]
    names = {
        "lr_mnist": "LR-MNIST, 100 rounds",
        "ten_thousand_10_rounds": "10,000 clients, 10 rounds",
    }
    present = [k for k in names if k in profiles]
    rows = [
        (phase, *(f"{profiles[k]['seconds'][phase]:.2f} s ({100 * profiles[k]['share'][phase]:.0f} %)"
                  for k in present))
        for phase in profiles[present[0]]["seconds"]
    ]  # fmt: skip
    rows.append(("profiled run", *(f"{profiles[k]['profiled_s']:.2f} s" for k in present)))
    return table(("phase", *(names[k] for k in present)), rows)
