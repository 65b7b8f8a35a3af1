"""Real sites: on loopback beside Flower's FedAvg and the simulation, the pilot on the
sites' own image folders, a round timed by phase (benchmarks/sites/federation_loopback.py), and
the hub's compose stack with sites in containers (scripts/federation_smoke.py)."""

from __future__ import annotations

from benchmarks.evidence.tables.cells import ratio_check, table
from benchmarks.evidence.tables.records import results_json


def loopback_block() -> str:
    """Real sites on loopback beside Flower's FedAvg and the simulation
    (benchmarks/sites/federation_loopback.py)."""
    r = results_json("federation-loopback")
    mb = r["mb_per_site_round"]
    rows = [
        (f"max \\|sites − simulation\\| (final global model, {r['rounds']} rounds)",
         f"**{r['max_abs_diff_vs_simulation']:.1g}**" + (" (bit-identical)" if r["max_abs_diff_vs_simulation"] == 0 else ""), "≤ 1e-6"),
        (f"{r['sites']} sites × {r['rounds']} rounds end to end: at the sites / simulated",
         f"{r['end_to_end_s']:.0f} s / {r['simulated_end_to_end_s']:.1f} s", ""),
        ("fedsieve, seconds per round", f"{r['round_s']:.1f}", ""),
        ("Flower's FedAvg, seconds per round", f"{r['flower_fedavg_round_s']:.1f}", ""),
        ("`round_time_over_flower_fedavg`", f"**{r['round_time_over_flower_fedavg']:.2f}**",
         ratio_check(r["round_time_over_flower_fedavg"], 0.1, at_most=True)),
        ("the same round simulated in-process", f"{r['simulated_round_s']:.2f} s", ""),
        ("`round_overhead_s` (sites − simulated)", f"{r['round_overhead_s']:.1f} s",
         ratio_check(r["round_overhead_s"], 5, at_most=True)),
        ("MB per site and round, hub → site (train + scoring) / site → hub",
         f"{mb['to_site']:.2f} / {mb['from_site']:.2f}", ""),
        ("an unregistered key", "refused" if r["unregistered_refused"] else "**accepted**", ""),
        (f"a ResNet-50-sized vector ({r['transport_94mb']['megabytes']:g} MB) to "
         f"{r['transport_94mb']['sites']} sites and back",
         f"{r['transport_94mb']['round_trip_s']:.1f} s, "
         + ("intact" if r["transport_94mb"]["echoed_intact"] else "**damaged**"), "crosses"),
    ]  # fmt: skip
    return table(("measure", "figure", "goal"), rows)


def loopback_own_data_block() -> str:
    """The pilot on the sites' own image folders with a hub that holds no data
    (benchmarks/sites/federation_loopback.py, ``own_data``)."""
    r = results_json("federation-loopback")["own_data"]
    kinds = ", ".join(f"{name} {kind.upper()}" for name, kind in r["sites"].items())
    rows = [
        ("sites and their images", kinds, ""),
        ("`hub_data_files_opened` (its data root holds the dataset's files)",
         f"**{r['hub_data_files_opened']}**", "0"),
        ("the count's control: one open of a data-root file by a process of the hub's environment",
         "counted" if r["audit_hook_counted_a_control_open"] else "**not counted**", "counted"),
        (f"`max_abs_diff_vs_simulation` (final global model, {r['rounds']} rounds)",
         f"**{r['max_abs_diff_vs_simulation']:.1g}**", "≤ 1e-6"),
        ("`pooled_auc_error` (pooled histograms vs the pooled predictions' AUC)",
         f"**{r['pooled_auc_error']:.1g}**", "≤ 1e-3"),
        ("`second_run_ok` (the same run again, its own rounds only)",
         "yes" if r["second_run_ok"] else "**no**", "yes"),
        (f"`site_restart_rejoined_s` (SIGKILL, restarted {r['site_restart_after_s']:g} s later)",
         f"{r['site_restart_rejoined_s']:.0f} s", ""),
    ]  # fmt: skip
    return table(("measure", "figure", "goal"), rows)


def loopback_restart_block() -> str:
    """A site killed mid-run and started again (benchmarks/sites/federation_loopback.py
    ``--restart-only``, ``restart``): when the hub let its old node go, the rounds the
    trail says it missed and why, and the first round it trained again."""
    r = results_json("federation-loopback")["restart"]
    missed = ", ".join(f"{n} ({why})" for n, why in r["rounds_missed"].items()) or "none"
    rows = [
        ("sites, rounds", f"{r['sites']}, {r['rounds']}", ""),
        (f"killed (SIGKILL) once round {r['killed_after_round']} was journaled, "
         f"started again {r['restart_after_s']:g} s later", "", ""),
        ("its old node counted offline by the hub, after the kill",
         f"{r['lapse_after_kill_s']:.0f} s (in round {r['lapsed_in_round']})", ""),
        ("rejoined, after that", f"{r['rejoined_after_lapse_s']:.1f} s", ""),
        ("rounds the trail says it missed (reason)", missed, ""),
        ("first round it trained again", f"{r['first_round_back']}", ""),
        ("**rounds missed after the round of the lapse**",
         f"**{r['rounds_missed_after_lapse_round']}**", "≤ 1"),
    ]  # fmt: skip
    return table(("measure", "figure", "goal"), rows)


# Flower 1.32.1's SuperNode looks for work every 3 s, hard-coded
# (flwr/supernode/start_client_internal.py), and starts a process per message
SUPERNODE_POLL_S = 3.0


def flower_floor(phases: dict[str, float]) -> float:
    """What one exchange cannot come under with Flower's design, whatever the site does:
    the SuperNode's poll, the message's own process start (measured) and the work itself."""
    return SUPERNODE_POLL_S + phases["start_s"] + phases["work_s"]


def loopback_phases_block() -> str:
    """A round at real sites timed by phase, at 3 and 10 sites (benchmarks/
    federation_loopback.py ``--phases-only``, ``by_phase``): per exchange, the medians of
    each site process's phases and of the hub's wall time."""
    by_phase = results_json("federation-loopback")["by_phase"]
    names = {
        "start_s": "process start, Python and Flower's runtime",
        "imports_s": "the ClientApp's imports (without a warm trainer: torch, the engine)",
        "flower_s": "Flower: the app loaded, the message handed over",
        "handoff_s": "to the site's warm trainer and back (Unix socket)",
        "data_s": "the task checked, the site's data at hand",
        "work_s": "training / scoring",
        "outside_s": "outside any site process (polls, spawn, TLS, serialisation)",
        "wall_s": "**the exchange, at the hub**",
    }
    columns = [(n, kind) for n in by_phase for kind in by_phase[n]["phases"]]
    header = ("seconds (median)", *(f"{n} sites, {kind}" for n, kind in columns))
    rows = [
        (label, *(f"{by_phase[n]['phases'][kind].get(key, 0.0):.2f}" for n, kind in columns))
        for key, label in names.items()
    ]
    rows.append((
        "answers from a warm trainer",
        *(f"{by_phase[n]['phases'][kind].get('warm_share', 0.0):.0%}" for n, kind in columns),
    ))  # fmt: skip
    floors = {(n, kind): flower_floor(by_phase[n]["phases"][kind]) for n, kind in columns}
    rows.append((
        f"Flower's floor: the SuperNode's {SUPERNODE_POLL_S:g} s poll + the process start + the work",
        *(f"{floors[column]:.2f}" for column in columns),
    ))  # fmt: skip
    rows.append((
        "**the exchange over that floor**",
        *(f"{by_phase[n]['phases'][kind]['wall_s'] - floors[n, kind]:.2f}" for n, kind in columns),
    ))  # fmt: skip
    totals = [
        ("a round at the sites (`round_s`)", "round_s"),
        ("the same round simulated here (`simulated_round_s`)", "simulated_round_s"),
        ("Flower's FedAvg on the same SuperNodes (`flower_fedavg_round_s`)", "flower_fedavg_round_s"),
        ("`round_time_over_flower_fedavg`", "round_time_over_flower_fedavg"),
        ("Flower's floor measured: a ClientApp that answers at once (`flower_floor_round_s`)",
         "flower_floor_round_s"),
        ("`round_time_over_flower_floor`", "round_time_over_flower_floor"),
    ]  # fmt: skip
    for label, key in totals:  # a round's figures, under each count's train column
        rows.append(
            (label, *(f"{by_phase[n][key]:.2f}" if kind == "train" else "" for n, kind in columns))
        )
    return table(header, rows)


def federation_smoke_block() -> str:
    """The hub's compose stack and three site containers (scripts/federation_smoke.py)."""
    r = results_json("federation-smoke")
    steps = list(r["steps_s"].items())
    site, hub = r["images"]["fedsieve-site:cpu"], r["images"]["fedsieve:cpu"]
    rows = [
        ("site image", f"{site['gb']} GB: environment layer {site['layers_mb']['environment']:,.0f} MB, "
         f"source layer {site['layers_mb']['source']} MB (what a source edit ships)"),
        ("hub image", f"{hub['gb']} GB: environment {hub['layers_mb']['environment']:,.0f} MB, "
         f"Flower's CLI {hub['layers_mb']['flower_cli']:.0f} MB, source {hub['layers_mb']['source']} MB"),
        *((step, f"{seconds:.0f} s") for step, seconds in steps),
        ("the whole smoke", f"{r['total_s']:.0f} s"),
        ("max \\|sites in containers − in-process simulation\\|", f"**{r['max_abs_diff_vs_simulation']}**"),
        *((check, "yes" if ok else "**no**") for check, ok in r["checks"].items()),
    ]  # fmt: skip
    return table(("measure", "figure"), rows)
