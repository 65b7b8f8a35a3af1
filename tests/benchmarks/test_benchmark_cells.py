"""What the evidence benchmarks count and which cells they run: the PID-MADE ablation's
detection record from a trail, and the regimes' settings (the small CNN; ALIE where its
authors ran it)."""

from __future__ import annotations

import pytest
import yaml

from benchmarks.papers import fedlag_table1, pid_made_ablation, pid_made_convergence
from benchmarks.robustness import matrix as robustness
from benchmarks.robustness import small_consortium


def trail_row(round_: int, client: int, malicious: bool, score: float, excluded: bool):
    return {
        "round": round_, "client": client, "malicious": malicious, "score": score,
        "excluded": excluded, "reason": "pid_made" if excluded else "", "distance": score,
    }  # fmt: skip


def test_the_ablation_counts_bans_by_round_five_and_ranks_clients_by_score():
    # clients 0 and 1 attack; 0 is banned in round 2, 1 only in round 7; honest 3 in round 1
    trail = []
    for t in range(1, 21):
        for client, bad, score in [
            (0, True, 9.0),
            (1, True, 2.5),
            (2, False, 1.0),
            (3, False, 3.0),
        ]:
            first = {0: 2, 1: 7, 3: 1}.get(client)
            trail.append(trail_row(t, client, bad, score, first is not None and t >= first))

    record = pid_made_ablation.detection(trail)

    assert record["attackers"] == 2 and record["attackers_banned"] == 2
    assert record["attackers_banned_by_5"] == 1 and record["honest_banned"] == 1
    # scores 9, 2.5 (attackers) against 1, 3 (honest): 3 of 4 pairs ranked right
    assert record["auc_round_1"] == record["auc_round_5"] == pytest.approx(0.75)


def test_a_clean_run_has_no_detection_auc():
    trail = [trail_row(t, c, False, float(c), False) for t in range(1, 21) for c in range(4)]

    record = pid_made_ablation.detection(trail)

    assert record["attackers"] == 0 and record["honest_banned"] == 0
    assert record["auc_round_5"] is None


def regime_cells(dataset: str, name: str):
    regime = robustness.REGIMES[name]
    base = yaml.safe_load((robustness.PARAMS / f"robustness-{dataset}.yaml").read_text())
    for section, changes in regime.changes.items():
        base[section] = {**base.get(section, {}), **changes}
    return robustness.cells_for(
        base, regime.methods, regime.attacks, regime.fractions, 2, regime.attack_options
    )


def test_alie_runs_in_its_papers_setting():
    cells = regime_cells("digits", "alie-paper")
    attacked = [c for c in cells if c.attack == "alie"]

    assert {c.params.partition.num_clients for c in cells} == {51}
    assert {c.params.model.name for c in cells} == {"small_cnn"}
    assert {c.params.attack.z for c in attacked} == {1.5}
    assert {c.params.attack.fraction for c in attacked} == {0.24}  # 12 of 51
    bulyan = next(c for c in attacked if c.method == "bulyan")
    assert bulyan.params.aggregate.model_dump()["f"] == 12  # n >= 4f + 3 holds exactly


def test_the_cnn_regime_changes_the_model_only():
    cells = regime_cells("breastmnist", "cnn")
    iid = regime_cells("breastmnist", "iid")

    assert {c.params.model.name for c in cells} == {"small_cnn"}
    assert {c.params.partition.model_dump_json() for c in cells} == {
        c.params.partition.model_dump_json() for c in iid
    }
    assert {c.method for c in cells} < {c.method for c in iid}


@pytest.mark.parametrize("dataset", ["breastmnist", "digits"])
def test_the_matrix_command_runs_every_attack_at_every_fraction_as_its_record_holds(dataset):
    """`python -m benchmarks.robustness.matrix --dataset <dataset>` (no options) runs the cells
    its committed per-seed record holds: every attack at every attacker fraction."""
    import csv

    cells = regime_cells(dataset, "iid")
    with (robustness.RESULTS / f"robustness-{dataset}-seeds.csv").open(newline="") as handle:
        recorded = {
            (r["method"], r["attack"], float(r["fraction"])) for r in csv.DictReader(handle)
        }

    assert {(c.method, c.attack, c.fraction) for c in cells} == recorded
    attacked = {(c.attack, c.fraction) for c in cells if c.attack != "none"}
    assert attacked == {(a, f) for a in robustness.EVERY_ATTACK for f in robustness.FRACTIONS}


@pytest.mark.parametrize("count", ["0", "-3", "two"])
@pytest.mark.parametrize("option", ["--seeds", "--workers"])
def test_a_count_that_is_not_positive_is_refused_before_anything_runs(
    option, count, monkeypatch, capsys
):
    """`--seeds 0` once fell back to the regime's default in silence; every evidence
    command now refuses it in one line naming the option."""
    for benchmark in (robustness, pid_made_ablation):
        monkeypatch.setattr("sys.argv", ["benchmark", option, count])
        with pytest.raises(SystemExit) as exit_:
            benchmark.main()

        assert exit_.value.code == 2
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"argument {option}: " in error and count in error


def test_a_matrix_whose_attacks_did_not_all_run_everywhere_says_which_ran_where():
    def records(attacks, fractions):
        return [{"attack": a, "fraction": f} for a in attacks for f in fractions]

    digits_like = [
        {"attack": "none", "fraction": 0.0},
        *records(["label_flip", "ipm"], [0.2, 0.4, 0.1, 0.3]),
        *records(["opt_ipm", "min_max"], [0.2, 0.4]),
    ]

    assert robustness.coverage(digits_like) == " (opt_ipm min_max at 0.2 0.4 only)"
    assert robustness.coverage(records(["label_flip", "opt_ipm"], [0.1, 0.2])) == ""


def test_every_ablation_variant_builds_the_filter_its_name_says():
    from aggregation import build_filter
    from aggregation.filters import PIDMADE, DistanceCUSUM

    built = {name: build_filter(**spec) for name, spec in pid_made_ablation.VARIANTS.items()}

    for name in ("paper_gaussian", "paper_chebyshev"):  # Algorithm 1, Theorems 6 and 5
        filt = built[name]
        assert isinstance(filt, PIDMADE) and filt.threshold == name.removeprefix("paper_")
        assert (filt.kp, filt.ki, filt.kd, filt.alpha) == (1.0, 0.5, 0.05, 0.05)
        assert filt.round_cut is None and filt.exclusion == "permanent"
    # the defaults but the reading the records were made with: banned updates left out
    assert built["paper_gaussian"] == build_filter("pid_made", banned_updates="left_out")
    assert build_filter("pid_made").banned_updates == "counted"  # the paper's, the default
    for name in ("paper_gaussian", "paper_chebyshev", "pid_robust_spent", "pid_robust_fixed",
                 "pid_cusum"):  # fmt: skip
        assert built[name].banned_updates == "left_out", name
    assert built["pid_robust_spent"].spending == "rounds"
    assert built["pid_robust_fixed"].spending == "none"
    assert built["pid_cusum"].threshold == "cusum" and built["pid_cusum"].round_cut is None
    for name in ("distance_cusum", "distance_cusum_cut"):
        assert isinstance(built[name], DistanceCUSUM)
        assert (built[name].drift, built[name].h) == (3.0, 8.0)
    assert built["distance_cusum"].round_cut is None
    assert built["distance_cusum_cut"].round_cut == robustness.ROUND_CUT == 11.0
    drift4 = built["distance_cusum_drift4"]
    assert isinstance(drift4, DistanceCUSUM) and (drift4.drift, drift4.h) == (4.0, 8.0)
    searched = [build_filter(**spec) for spec in pid_made_ablation.SEARCH.values()]
    assert all(isinstance(filt, DistanceCUSUM) for filt in searched)


def committed(path, **key: str) -> dict[str, str]:
    import csv

    with path.open(newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if all(r[k] == v for k, v in key.items())]
    assert len(rows) == 1, key
    return rows[0]


@pytest.fixture
def as_a_benchmark_worker():
    """One torch thread, as the benchmark's worker processes run (the records were made
    so), restored afterwards: a test must not change the thread count of the process the
    next tests run in (a warm trainer's answers are compared bit for bit)."""
    import torch

    threads = torch.get_num_threads()
    robustness.one_torch_thread()
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("as_a_benchmark_worker")
def test_one_held_out_seed_of_every_ablation_variant_reruns_to_its_committed_row():
    cells = pid_made_ablation.cells_for("digits", range(10, 11))
    cells = [cell for cell in cells if cell.attack == "label_flip"]
    assert len(cells) == len(pid_made_ablation.VARIANTS)

    for cell in cells:
        record = pid_made_ablation.run_ablation_cell(cell)
        row = committed(
            pid_made_ablation.STEM.with_name("pid-made-ablation-seeds.csv"),
            dataset="digits", variant=record["variant"], attack="label_flip", seed="10",
        )  # fmt: skip
        assert float(row["test_acc"]) == pytest.approx(record["metrics"]["test_acc"], abs=1e-6)
        for key in ("honest_banned", "attackers_banned", "attackers_banned_by_5"):
            assert int(row[key]) == record["detection"][key], (record["variant"], key)


@pytest.mark.usefixtures("as_a_benchmark_worker")
def test_the_matrix_rows_once_shown_as_pid_made_are_the_distance_cusum_with_the_round_cut():
    # the records of pid_made's old default, relabelled: one cell reruns to its row
    base = yaml.safe_load((robustness.PARAMS / "robustness-digits.yaml").read_text())
    [cell] = robustness.cells_for(base, ["distance_cusum_cut_fedavg"], ["opt_ipm"], [0.2], 1)

    [rerun] = robustness.seed_rows([robustness.run_cell(cell)])

    row = committed(
        robustness.RESULTS / "robustness-digits-seeds.csv",
        method="distance_cusum_cut_fedavg", attack="opt_ipm", fraction="0.2", seed="0",
    )  # fmt: skip
    assert {k: str(rerun[k]) for k in ("test_acc", "fp", "fn", "acc_curve")} == {
        k: row[k] for k in ("test_acc", "fp", "fn", "acc_curve")
    }


@pytest.mark.usefixtures("as_a_benchmark_worker")
def test_the_filters_rows_relabelled_left_out_rerun_to_their_committed_row():
    """The rows once named pid_made_fedavg were made with banned updates left out: they are
    pid_made_left_out_fedavg now (pid_made_fedavg runs the paper's reading, counted), and
    one held-out cell of them reruns under that name to its row."""
    base = yaml.safe_load((robustness.PARAMS / "robustness-digits.yaml").read_text())
    cells = robustness.cells_for(base, ["pid_made_left_out_fedavg"], ["label_flip"], [0.2], 6)

    [rerun] = robustness.seed_rows([robustness.run_cell(cells[5])])

    row = committed(
        robustness.RESULTS / "robustness-digits-filters-seeds.csv",
        method="pid_made_left_out_fedavg", attack="label_flip", fraction="0.2", seed="5",
    )  # fmt: skip
    assert robustness.FILTERED["pid_made_left_out_fedavg"]["banned_updates"] == "left_out"
    assert robustness.FILTERED["pid_made_fedavg"]["banned_updates"] == "counted"
    assert {k: str(rerun[k]) for k in ("test_acc", "fp", "fn", "acc_curve")} == {
        k: row[k] for k in ("test_acc", "fp", "fn", "acc_curve")
    }


@pytest.mark.usefixtures("as_a_benchmark_worker")
def test_chebyshevs_threshold_bans_nobody_among_20_so_both_readings_run_alike(monkeypatch):
    """With 20 clients no z-score reaches Chebyshev's k (Samuelson's bound), so nobody is
    banned and no update is ever left out: a cell under scaling run with banned updates
    counted and left out gives the same row, which is why pid_made_chebyshev_fedavg's
    records, made under left_out, are the counted ones."""
    left_out = robustness.FILTERED["pid_made_chebyshev_fedavg"] | {"banned_updates": "left_out"}
    monkeypatch.setitem(robustness.FILTERED, "chebyshev_left_out", left_out)
    base = yaml.safe_load((robustness.PARAMS / "robustness-digits.yaml").read_text())
    methods = ["pid_made_chebyshev_fedavg", "chebyshev_left_out"]
    cells = robustness.cells_for(base, methods, ["scaling"], [0.2], 1)

    counted, left = robustness.seed_rows([robustness.run_cell(cell) for cell in cells])

    assert counted["fp"] == 0 and counted["fn"] == counted["attacker_rounds"]  # nobody out
    assert {k: v for k, v in counted.items() if k != "method"} == {
        k: v for k, v in left.items() if k != "method"
    }


@pytest.mark.usefixtures("as_a_benchmark_worker")
def test_one_convergence_run_reruns_to_its_committed_curves():
    import json

    [cell] = [c for c in pid_made_convergence.cells_for(1)
              if c.name == "pid_made-label_flip-f0.2-s0"]  # fmt: skip

    rerun = pid_made_convergence.run_row(robustness.run_cell(cell))

    record = json.loads(pid_made_convergence.STEM.with_suffix(".json").read_text())
    [row] = [r for r in record["rows"]
             if (r["method"], r["fraction"], r["seed"]) == ("pid_made", 0.2, 0)]  # fmt: skip
    assert rerun == row


def test_a_missing_dataset_stops_the_matrix_before_any_cell_runs(tmp_path, monkeypatch):
    """Without its data file the command once ran all 640 cells into the same error,
    left them in the cells file (a rerun would skip them) and overwrote the committed
    summary with an empty one. Now it stops in one line, and a cells file of failures
    alone leaves the summary as it was."""
    monkeypatch.delenv("MEDMNIST_ROOT", raising=False)
    base = yaml.safe_load((robustness.PARAMS / "robustness-breastmnist.yaml").read_text())
    base["data"] = {**base["data"], "root": str(tmp_path / "empty"), "download": False}
    cells = robustness.cells_for(base, ["fedavg"], ["none"], [0.2], 1)
    cells_file = tmp_path / "cells.jsonl"

    with pytest.raises(SystemExit) as stopped:
        robustness.run_matrix(cells, cells_file, workers=1)

    message = str(stopped.value.code)
    assert message.startswith("no cell was run: ") and "breastmnist.npz not found" in message
    assert "\n" not in message and not cells_file.exists()

    monkeypatch.setattr(robustness, "RESULTS", tmp_path)
    failed = {"name": "fedavg-none-f0-s0", "method": "fedavg", "attack": "none",
              "fraction": 0.0, "seed": 0, "error": "DataError: not found", "seconds": 0.0}  # fmt: skip
    cells_file.write_text(robustness.json.dumps(failed) + "\n")
    with pytest.raises(SystemExit, match=r"no cell finished \(1 failed; first: DataError"):
        robustness.summarise("failed", "breastmnist", "command", cells_file, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cells.jsonl"]


def test_the_small_consortium_reads_when_the_attacker_was_out_and_what_honest_sites_lost():
    trail = [
        {"round": 1, "client": 0, "malicious": True, "excluded": False},
        {"round": 1, "client": 1, "malicious": False, "excluded": True},
        {"round": 2, "client": 0, "malicious": True, "excluded": True},
        {"round": 2, "client": 1, "malicious": False, "excluded": True},
        {"round": 2, "client": 2, "malicious": False, "excluded": False},
    ]
    assert small_consortium.exclusions(trail) == {
        "attackers": 1, "attacker_out_round": 2, "honest_client_rounds_excluded": 2,
        "honest_banned": 1,
    }  # fmt: skip
    never = [dict(row, excluded=False) for row in trail]
    assert small_consortium.exclusions(never)["attacker_out_round"] is None


def _runs(dataset, sites, attack, defence, out_rounds, honest_banned=0):
    """Ten runs of one cell: the attacker out in the rounds given (None: never)."""
    return [
        {"dataset": dataset, "sites": sites, "attack": attack, "defence": defence,
         "seed": seed, "attacker_out_round": out, "honest_client_rounds_excluded": 0,
         "honest_banned": int(seed < honest_banned), "test_acc": 0.9, "error": ""}
        for seed, out in enumerate(out_rounds)
    ]  # fmt: skip


def test_the_small_consortium_recommends_by_its_pre_registered_rule(tmp_path):
    late = [2] * 8 + [4, None]  # out by round 3 in 8 of 10: does not hold
    runs = (
        _runs("breastmnist", 3, "label_flip", "distance_cusum", late)
        + _runs("digits", 3, "label_flip", "distance_cusum", [1] * 10)
        + _runs("breastmnist", 3, "label_flip", "site_validation", [3] * 9 + [None])
        + _runs("digits", 3, "label_flip", "site_validation", [2] * 10, honest_banned=2)
        + _runs("breastmnist", 3, "label_flip", "pid_made", [1] * 10)
        + _runs("digits", 3, "label_flip", "pid_made", [1] * 10, honest_banned=1)
        + _runs("breastmnist", 3, "sign_flip", "pid_made", [None] * 10)
        + _runs("breastmnist", 3, "sign_flip", "distance_cusum", [1] * 10)
        + _runs("digits", 3, "label_flip", "median", [None] * 10)
        + _runs("digits", 4, "label_flip", "distance_cusum", late)
    )
    # the per-run record is written and read back as the claims read it
    path = tmp_path / "seeds.csv"
    small_consortium.write_seed_rows(runs, path)
    rows = small_consortium.rows_of(small_consortium.read_seed_rows(path))
    row = next(r for r in rows if (r["dataset"], r["sites"], r["defence"])
               == ("breastmnist", 3, "distance_cusum") and r["attack"] == "label_flip")  # fmt: skip
    assert (row["seeds"], row["caught_seeds"], row["caught_by_round_seeds"]) == (10, 9, 8)
    assert (row["median_round"], row["false_exclusions"], row["honest_banned_seeds"]) == (2, 0, 0)
    # pid_made holds against the flipper on both datasets (one honest ban is allowed)
    assert small_consortium.recommended(rows, 3) == {
        "defence": "pid_made", "holds_on": ["breastmnist", "digits"], "fails_on": [],
    }  # fmt: skip
    # without it: a tie on one dataset each, broken by the other attacks' count
    without = [r for r in rows if r["defence"] != "pid_made"]
    assert small_consortium.recommended(without, 3) == {
        "defence": "distance_cusum", "holds_on": ["digits"], "fails_on": ["breastmnist"],
    }  # fmt: skip
    # nothing holds at 4 sites: the median alone, every dataset named
    assert small_consortium.recommended(rows, 4) == {
        "defence": "median", "holds_on": [], "fails_on": ["digits"],
    }  # fmt: skip


def test_the_small_consortium_grid_is_every_dataset_size_attack_and_defence():
    from aggregation.registry import list_filters

    # every defence whose filters this checkout registers (site_validation lands apart)
    defences = tuple(
        name for name, spec in small_consortium.DEFENCES.items()
        if all(f["name"] in list_filters() for f in spec)
    )  # fmt: skip
    cells = small_consortium.cells_for(range(1), defences)
    assert len(cells) == (
        len(small_consortium.DATASETS) * len(small_consortium.SIZES)
        * len(small_consortium.ATTACKED) * len(defences)
    )  # fmt: skip
    ten = [c for c in cells if c.params.partition.num_clients == 10]
    assert {c.params.aggregate.name for c in ten} == {"median"}
    assert {round(c.fraction * 10) for c in ten} == {1}
    assert {c.params.data.dataset for c in ten} == set(small_consortium.DATASETS)
    # only validation at the sites holds out each site's split (it scores candidates there)
    held_out = {c.method.split(".")[-1]: c.params.partition.local_test for c in cells}
    assert held_out == {d: small_consortium.HELD_OUT.get(d, 0.0) for d in defences}


def test_the_small_cnn_family_trains_params_yamls_model_as_params_yaml_says():
    """The family a user's runs read (--model small_cnn): params.yaml's model and local
    training, its registered sizes, attacks and defences; a grid stopped at its time
    keeps whole rows and names the rest."""
    import yaml

    family = small_consortium.FAMILIES["small_cnn"]
    cells = small_consortium.cells_for(
        range(1), family.defences, family.datasets, family.sizes, family
    )
    assert len(cells) == 3 * 2 * 2 * 4  # datasets, sizes, attacks, defences
    defaults = yaml.safe_load((small_consortium.REPO / "params.yaml").read_text())
    for cell in cells:
        assert cell.params.model.name == defaults["model"]["name"] == "small_cnn"
        train = cell.params.train
        assert {k: getattr(train, k) for k in small_consortium.LOCAL_SETTINGS} == {
            k: defaults["train"][k] for k in small_consortium.LOCAL_SETTINGS
        }
    assert {c.params.partition.num_clients for c in cells} == {3, 5}
    assert {c.attack for c in cells} == {"label_flip", "sign_flip"}
    # the logistic family keeps the robustness matrix's training
    [logistic] = small_consortium.cells_for(range(1), ("median",), ("digits",), (3,))[:1]
    assert (logistic.params.model.name, logistic.params.train.batch_size) == ("logreg", 16)
    runs = _runs("breastmnist", 3, "label_flip", "median", [None] * 10) + _runs(
        "digits", 3, "label_flip", "median", [None] * 4
    )
    kept = small_consortium.whole_rows(runs, 10)
    assert {r["dataset"] for r in kept} == {"breastmnist"} and len(kept) == 10
    rows = small_consortium.rows_of(kept)
    missing = small_consortium.not_run(rows, family)
    assert "digits/3/label_flip/median" in missing
    assert "breastmnist/3/label_flip/median" not in missing
    assert len(missing) == 3 * 2 * 2 * 4 - 1


def test_the_label_skewed_cnn_regime_is_the_cnn_on_the_logistic_regimes_clients():
    cells = regime_cells("digits", "dirichlet-0.5-cnn")
    logistic = regime_cells("digits", "dirichlet-0.5")

    assert {c.params.model.name for c in cells} == {"small_cnn"}
    assert {c.params.partition.model_dump_json() for c in cells} == {
        c.params.partition.model_dump_json() for c in logistic
    }
    assert {c.params.partition.alpha for c in cells} == {0.5}
    # 4 rules x (no attack, sign flipping and ALIE at a fifth): 12 scenarios, here 2 seeds
    assert len(cells) == 12 * 2
    assert {c.params.attack.fraction for c in cells if c.attack != "none"} == {0.2}


def test_table1_runs_every_method_in_every_regime_on_every_dataset_with_one_local_optimizer():
    cells = fedlag_table1.cells_for("clean", range(2))
    where = {fedlag_table1.coordinates(c) for c in cells}

    assert where == {
        (d, r, m)
        for d in fedlag_table1.DATASETS
        for r in fedlag_table1.REGIMES
        for m in fedlag_table1.METHODS
    }
    assert len(cells) == len(where) * 2 and {c.attack for c in cells} == {"none"}
    # plain local SGD for every method, as SCAFFOLD's option II needs
    assert {c.params.train.momentum for c in cells} == {0.0}
    by = {fedlag_table1.coordinates(c): c.params for c in cells}
    assert by["digits", "dirichlet-0.1", "scaffold"].train.scaffold
    assert by["digits", "dirichlet-0.1", "fedprox"].train.prox_mu == 0.01
    assert by["digits", "dirichlet-0.1", "fedadam"].train.server_step()[0] == "adam"
    assert by["digits", "dirichlet-0.1", "fedavg"].partition.alpha == 0.1
    quantity = by["retinamnist", "quantity", "fednova"]
    assert quantity.aggregate.name == "fednova" and quantity.train.local_work.epochs == (1, 3)
    assert by["retinamnist", "iid", "fednova"].train.local_work is None
    assert {c.params.partition.local_test for c in cells} == {fedlag_table1.LOCAL_TEST}


def test_table1s_attacked_part_has_a_fifth_attacking_and_fedadam_on_the_robust_rules():
    cells = fedlag_table1.cells_for("attacked", range(1), ("digits",))
    methods = {fedlag_table1.coordinates(c)[2]: c.params for c in cells}

    assert {c.attack for c in cells} == {"none", *fedlag_table1.ATTACKED}
    assert {c.params.attack.fraction for c in cells if c.attack != "none"} == {0.2}
    assert {c.params.partition.alpha for c in cells} == {0.5}
    robust = {m: p for m, p in methods.items() if m in fedlag_table1.ROBUST_FEDADAM}
    assert {p.train.server_step()[0] for p in robust.values()} == {"adam"}
    assert methods["pid_made_fedadam"].filters[0].name == "pid_made"
    # every method also without attack: the same runs (by name) as the clean part's at α 0.5
    assert {c.attack for c in cells if fedlag_table1.coordinates(c)[2] == "fedavg"} == {
        "none",
        *fedlag_table1.ATTACKED,
    }
    clean = {c.name for c in fedlag_table1.cells_for("clean", range(1), ("digits",))}
    unattacked = {c.name for c in cells
                  if c.attack == "none" and fedlag_table1.coordinates(c)[2] in fedlag_table1.METHODS}  # fmt: skip
    assert len(unattacked) == len(fedlag_table1.METHODS) and unattacked <= clean


def test_the_volume_row_is_the_small_3d_cnn_at_64_voxels_as_pre_registered():
    cells = regime_cells("adrenalmnist3d", "cnn3d")

    assert {(c.params.data.dataset, c.params.data.size) for c in cells} == {("adrenalmnist3d", 64)}
    assert {c.params.model.name for c in cells} == {"small_cnn3d"}
    assert {(c.params.train.rounds, c.params.train.local_epochs) for c in cells} == {(3, 1)}
    # 4 methods x label and sign flipping at a fifth of 10 clients, here 2 seeds
    assert {(c.method, c.attack) for c in cells} == {
        (m, a)
        for m in ("fedavg", "median", "pid_made_fedavg", "fedlag")
        for a in ("label_flip", "sign_flip")
    }
    assert len(cells) == 8 * 2 and {c.params.attack.fraction for c in cells} == {0.2}
    assert robustness.REGIMES["cnn3d"].train_volumes == 120


def test_a_training_subset_keeps_each_class_share_and_is_the_same_for_every_cell(adrenal_root):
    import numpy as np

    from federated.data import load_medmnist

    data = load_medmnist("adrenalmnist3d", adrenal_root, 64)

    first = robustness.stratified_subset(data, 120)
    again = robustness.stratified_subset(data, 120)

    assert len(first.train) == 120 and np.array_equal(first.train.images, again.train.images)
    full_share = data.train.targets.mean()
    assert abs(first.train.targets.mean() - full_share) < 1 / 120
    assert len(first.test) == len(data.test) and len(first.val) == len(data.val)
    assert robustness.stratified_subset(data, 5000) is data  # more than there are: all of them
