"""The claims ledger's one multiple-testing policy: every test claim declares its family
and adjustment, the loader refuses one that does not, and the check applies exactly the
declared adjustment, over the generated table a claim is read from or over the ledger
claims that share a family."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from statsmodels.stats.multitest import multipletests

from benchmarks.evidence import claims
from benchmarks.evidence.tables.paired_tables import paired_table

# Label flipping by a fifth lowers FedAvg's accuracy on the digits CNN in all ten seeds
# (sign-flip p = 2/2¹⁰), one of the 56 drops of robustness-digits-cnn.
FLIPPED = {
    "id": "C91", "text": "label flipping lowers FedAvg's accuracy", "kind": "drop",
    "record": "digits-cnn", "method": "fedavg", "attack": "label_flip", "fraction": 0.2,
}  # fmt: skip
# On the held-out BreastMNIST seeds the paper's Gaussian threshold has every flipper out
# by round 5 in 7 runs the distance CUSUM misses, and the reverse in none: McNemar
# p = 0.0156, one of the 28 tests of the ablation's paired table.
CAUGHT = {
    "id": "C92", "text": "the Gaussian threshold catches more", "kind": "ablation",
    "dataset": "breastmnist", "first": "paper_gaussian", "second": "distance_cusum",
    "outcome": "caught", "more": True,
}  # fmt: skip


def written(tmp_path: Path, ledger: list[dict[str, Any]]) -> Path:
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(ledger, allow_unicode=True))
    return path


def refusal(tmp_path: Path, ledger: list[dict[str, Any]], declared_lists: bool = False) -> str:
    with pytest.raises(claims.LedgerError) as refused:
        claims.load_ledger(written(tmp_path, ledger), declared_lists)
    message = str(refused.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("declared", "said"),
    [
        ({}, "claim C91 (drop) must declare family: (a name) and adjust: holm | none"),
        ({"family": "robustness-digits-cnn"}, "got family 'robustness-digits-cnn', adjust None"),
        ({"family": "x", "adjust": "bonferroni"}, "adjust: holm | none (with reason:)"),
        (
            {"family": "x", "adjust": "none"},
            "claim C91 (drop) has adjust: none, which needs reason:",
        ),
        (
            {"family": "robustness-digits-cnn-paired", "adjust": "holm"},
            "names family 'robustness-digits-cnn-paired', a table that does not hold its test; "
            "allowed: robustness-digits-cnn or a name of your own",
        ),
    ],
)
def test_a_test_claim_without_its_family_and_adjustment_is_refused_in_one_line(
    declared, said, tmp_path
):
    assert said in refusal(tmp_path, [FLIPPED | declared])


def test_a_bound_takes_no_family_and_a_table_claim_takes_its_table_as_family(tmp_path):
    bound = {"id": "C93", "text": "x", "kind": "worst_case", "record": "digits-cnn",
             "method": "median", "fraction": 0.2, "at_least": 0.9}  # fmt: skip
    in_table = {
        "id": "C94", "text": "x", "kind": "better", "record": "digits-cnn", "first": "median",
        "second": "fedavg", "fraction": 0.2, "statistic": "worst",
        "table": "robustness-digits-cnn-paired", "row": "0.2",
    }  # fmt: skip

    assert "claim C93 (worst_case) is a bound or a count, not a test: adjust, family not" in (
        refusal(tmp_path, [bound | {"family": "x", "adjust": "holm"}])
    )
    assert "so its family is robustness-digits-cnn-paired, got 'mine'" in refusal(
        tmp_path, [in_table | {"family": "mine", "adjust": "holm"}]
    )
    assert "the claims of family mine must share one adjust" in refusal(
        tmp_path,
        [FLIPPED | {"family": "mine", "adjust": "holm"},
         CAUGHT | {"family": "mine", "adjust": "none", "reason": "one question"}],
        declared_lists=True,
    )  # fmt: skip


def test_a_declared_list_of_claims_is_holm_adjusted_together(tmp_path):
    """Three drops on the digits CNN stated as one family before their data (a list the
    pre-registration may declare): each is judged by Holm over the three raw p-values, as
    statsmodels adjusts them, whatever the other drops of the table."""
    family = {"family": "stated-together", "adjust": "holm"}
    ledger = [
        FLIPPED | family,
        FLIPPED | family | {"id": "C95", "method": "centered_clipping", "attack": "ipm"},
        FLIPPED | family | {"id": "C96", "method": "median", "attack": "sign_flip"},
    ]
    raw = [claims.drop(claim).p for claim in ledger]
    expected = multipletests(raw, method="holm")[1]

    found = claims.verdicts(written(tmp_path, ledger), declared_lists=True)

    assert raw == pytest.approx([2 / 2**10, 0.015625, 0.0078125])
    for verdict, p, p_holm in zip(found, raw, expected, strict=True):
        assert f"sign-flip p = {p:.3g}, Holm over 3 tests of stated-together = {p_holm:.3g}" in (
            verdict.test
        )
    assert [v.holds for v in found] == [p_holm < 0.05 for p_holm in expected]


def test_a_claim_that_passes_raw_but_fails_holm_over_its_table_fails_the_check(tmp_path):
    """The McNemar p of 0.0156 and the drop's 0.00195 pass alone; over the 28 tests of
    the ablation's table (0.375) and the 56 drops of the CNN's table (0.109) they do not. Declared unadjusted, with a reason, the same tests pass."""
    ledger = [
        CAUGHT | {"family": "pid-made-ablation-paired", "adjust": "holm"},
        FLIPPED | {"family": "robustness-digits-cnn", "adjust": "holm"},
    ]
    path = written(tmp_path, ledger)
    unadjusted = [c | {"adjust": "none", "reason": "a stated single question"} for c in ledger]

    found = claims.verdicts(path)
    alone = claims.verdicts(written(tmp_path, unadjusted))

    assert [v.holds for v in found] == [False, False]
    assert "exact McNemar p = 0.0156, Holm over 28 tests of pid-made-ablation-paired = 0.375" in (
        found[0].test
    )
    assert "sign-flip p = 0.00195, Holm over 56 tests of robustness-digits-cnn = 0.109" in (
        found[1].test
    )
    assert [v.holds for v in alone] == [True, True]
    assert "not adjusted (28 tests of pid-made-ablation-paired: a stated single question)" in (
        alone[0].test
    )


def test_an_ablation_claim_the_table_does_not_test_is_refused(tmp_path):
    claim = CAUGHT | {"second": "paper_chebyshev", "family": "pid-made-ablation-paired",
                      "adjust": "holm"}  # fmt: skip

    with pytest.raises(claims.LedgerError, match=r"pid-made-ablation-paired holds no test of "):
        claims.verdicts(written(tmp_path, [claim]))


# With 8 of 40 clients flipping labels PID-MADE's mean test loss over the rounds is below
# FedAvg's in all ten seeds (sign-flip p = 2/2¹⁰), one of the five attacker shares of
# pid-made-convergence-paired.
CONVERGED = {
    "id": "C97", "text": "PID-MADE's loss falls lower than FedAvg's", "kind": "convergence",
    "table": "pid-made-convergence-paired", "row": "0.2", "fraction": 0.2,
    "first": "pid_made", "second": "fedavg", "lower": True,
    "family": "pid-made-convergence-paired", "adjust": "holm",
}  # fmt: skip


def test_a_convergence_claim_is_judged_by_holm_over_its_table_and_only_the_way_it_points(
    tmp_path,
):
    """The claim's difference is the table's row, judged over the table's five shares;
    the same test claimed the other way (PID-MADE higher) fails."""
    wrong_way = {k: v for k, v in CONVERGED.items() if k != "lower"} | {"higher": True}
    table = paired_table("pid-made-convergence-paired")
    row_mean = table.tests[table.index_of("pid_made", "0.2")][2][0].mean()

    lower, higher = claims.verdicts(written(tmp_path, [CONVERGED, wrong_way | {"id": "C98"}]))

    held = "sign-flip p = 0.00195, Holm over 5 tests of pid-made-convergence-paired = 0.00977"
    assert lower.holds and held in lower.test
    assert f"Δ mean test loss over rounds (pid_made − fedavg) = {row_mean:+.3f} over 10 seeds" == (
        lower.statistic
    )
    assert not higher.holds and held in higher.test


def test_a_convergence_claim_needs_its_family_and_the_row_of_its_attacker_share(tmp_path):
    undeclared = {k: v for k, v in CONVERGED.items() if k not in ("family", "adjust")}
    assert "claim C97 (convergence) must declare family: (a name) and adjust" in refusal(
        tmp_path, [undeclared]
    )
    with pytest.raises(claims.LedgerError, match=r"C97: a convergence claim is read off "
                       r"pid-made-convergence-paired at the row of its attacker share, got "
                       r"table 'pid-made-convergence-paired', row '0.3', fraction 0.2"):  # fmt: skip
        claims.verdicts(written(tmp_path, [CONVERGED | {"row": "0.3"}]))


# At Dirichlet α = 0.1 FedLag ends below FedAvg's accuracy: a row of fedlag-stability-paired.
STEADIER = {
    "id": "C96", "text": "FedLag ends lower than FedAvg at α = 0.1", "kind": "stability",
    "table": "fedlag-stability-paired", "row": "0.1, ACC", "alpha": 0.1, "first": "fedlag",
    "second": "fedavg", "measure": "acc", "lower": True,
    "family": "fedlag-stability-paired", "adjust": "holm",
}  # fmt: skip


def test_a_stability_claim_is_read_off_the_row_of_its_alpha_and_measure(tmp_path):
    [verdict] = claims.verdicts(written(tmp_path, [STEADIER]))
    assert verdict.holds and "Holm over 12 tests of fedlag-stability-paired" in verdict.test
    for wrong in ({"row": "0.5, ACC"}, {"row": "0.1, wobble"}):
        with pytest.raises(claims.LedgerError, match=r"C96: a stability claim is read off "
                           r"fedlag-stability-paired at the row of its α and measure"):  # fmt: skip
            claims.verdicts(written(tmp_path, [STEADIER | wrong]))


def test_every_family_is_a_whole_generated_table_or_a_declared_list():
    """A ledger claim (written after its data) takes as family the generated table it is
    read from, all of it; only the pre-registration declares lists of claims, each member
    in that file. The loader refuses the rest (next test)."""
    from benchmarks.evidence import preregistration

    for claim in claims.load_ledger():
        if claim["kind"] in claims.TEST_KINDS:
            assert claim["family"] == claims.table_family(claim), claim["id"]
    registered = preregistration.load()
    lists = claims.ledger_families(registered)
    for claim in registered:
        if claim["kind"] not in claims.TEST_KINDS:  # a count or a bound: no family
            assert "family" not in claim, claim["id"]
            continue
        family = claim["family"]
        assert family == claims.table_family(claim) or claim in lists[family], claim["id"]


def test_a_ledger_claim_naming_a_list_of_claims_is_refused(tmp_path):
    """Two claims read off the CNN's drops, declared a family of their own: a subset of
    the table's 56 drops chosen by hand."""
    declared = {"family": "two-drops", "adjust": "holm"}
    second = FLIPPED | declared | {"id": "C93", "attack": "sign_flip"}

    said = refusal(tmp_path, [FLIPPED | declared, second])

    assert "claim C91 names family 'two-drops', a list of claims" in said
    assert claims.load_ledger(written(tmp_path, [FLIPPED | declared, second]), True)


def test_a_consortium_claim_counts_the_small_consortiums_runs():
    """Counted off the committed per-run record: the row's seeds with the attacker out by
    the rule's round, and those with an honest site banned, against the claim's bounds."""
    from benchmarks.robustness import small_consortium

    rows = small_consortium.rows_of(small_consortium.read_seed_rows())
    [row] = [r for r in rows if (r["dataset"], r["sites"], r["attack"], r["defence"])
             == ("breastmnist", 3, "label_flip", "distance_cusum")]  # fmt: skip
    caught = row["caught_by_round_seeds"]
    claim = {"id": "P9", "text": "t", "kind": "consortium", "dataset": "breastmnist",
             "sites": 3, "attack": "label_flip", "defence": "distance_cusum"}  # fmt: skip
    assert claims.consortium(claim | {"caught_at_most": caught}).holds
    assert not claims.consortium(claim | {"caught_at_most": caught - 1}).holds
    assert not claims.consortium(claim | {"caught_at_least": caught + 1}).holds
    banned = row["honest_banned_seeds"]
    bounded = claim | {"caught_at_most": caught, "honest_banned_at_most": banned}
    assert claims.consortium(bounded).holds
    assert not claims.consortium(bounded | {"honest_banned_at_most": banned - 1}).holds
    # a defence the record has not run yet: pending, never judged
    assert claims.pending(claim | {"defence": "not_run"})
    assert not claims.pending(claim)


def table1_record(tmp_path: Path) -> Path:
    """A Table 1 record written by the benchmark's own writer: SCAFFOLD 0.02 above FedAvg
    on both datasets in every seed and regime, but halted on digits at α = 0.1 in seed 9."""
    from benchmarks.papers import fedlag_table1

    records = []
    for seed in range(10):
        for dataset in ("breastmnist", "digits"):
            for regime, level in (("dirichlet-0.1", 0.7), ("iid", 0.9)):
                for method, lift in (("fedavg", 0.0), ("scaffold", 0.02)):
                    records.append({
                        "dataset": dataset, "regime": regime, "method": method,
                        "attack": "none", "fraction": 0.0, "seed": seed,
                        "test_acc": level + lift + seed / 1000, "test_auc": 0.8,
                        "site_acc_worst": 0.5, "rounds_to_target": 3, "rounds": 10,
                        "majority_share": 0.6, "seconds": 1.0,
                    })  # fmt: skip
    halted = records[-3]  # seed 9, digits, α = 0.1, scaffold
    assert (halted["seed"], halted["dataset"], halted["regime"], halted["method"]) == (
        9, "digits", "dirichlet-0.1", "scaffold"
    )  # fmt: skip
    for key in ("test_acc", "test_auc", "site_acc_worst", "rounds_to_target", "majority_share"):
        del halted[key]
    halted["error"] = "ModelDiverged: the global model is not finite"
    path = tmp_path / "fedlag-table1-seeds.csv"
    fedlag_table1.write_seed_rows(records, path)
    return path


def test_a_table1_claim_pairs_by_seed_over_the_datasets_and_counts_a_halted_run_at_chance(
    tmp_path, monkeypatch
):
    from benchmarks.evidence.tables import table1

    monkeypatch.setattr(table1, "RECORD", table1_record(tmp_path))
    family = {"family": "table1-test", "adjust": "holm", "regime": "dirichlet-0.1"}
    higher = {"id": "P98", "text": "SCAFFOLD ends higher", "kind": "table1", "measure": "acc",
              "first": "scaffold", "second": "fedavg"} | family  # fmt: skip
    smaller_drop = higher | {"id": "P99", "text": "SCAFFOLD loses less", "measure": "drop",
                             "lower": True}  # fmt: skip

    found = claims.verdicts(written(tmp_path, [higher, smaller_drop]), declared_lists=True)

    # seeds 0-8: +0.02; seed 9: the halted run at the majority share, 0.6 − 0.709 on digits
    mean = (9 * 0.02 + (0.02 + 0.6 - 0.709) / 2) / 10
    assert found[0].statistic == (
        f"Δ acc at dirichlet-0.1 (scaffold − fedavg) = {mean:+.3f} over 10 seeds"
    )
    # the exact two-sided sign-flip p, every one of the 1024 sign patterns counted
    means = [0.02] * 9 + [(0.02 + 0.6 - 0.709) / 2]
    sums = [sum(m if (pattern >> i) & 1 else -m for i, m in enumerate(means))
            for pattern in range(2**10)]  # fmt: skip
    p = sum(abs(total) >= sum(means) - 1e-9 for total in sums) / 2**10
    assert f"sign-flip p = {p:.3g}, Holm over 2 tests" in found[0].test and p > 0.05
    assert found[0].holds is False  # the halted seed's loss outweighs two seeds' gains
    # ... and that halted run is accuracy lost to label skew: SCAFFOLD loses more there
    assert found[1].statistic.startswith("Δ drop at dirichlet-0.1 (scaffold − fedavg) = +0.006")
    assert "the difference points the other way" in found[1].test and not found[1].holds
    # judged by the pre-registration only on its whole design: RetinaMNIST is missing here
    assert not table1.table1_complete(higher) and claims.pending(smaller_drop)
    wobble = higher | {"measure": "wobble"}
    with pytest.raises(claims.LedgerError, match="measure 'wobble'; allowed: acc, auc"):
        claims.verdicts(written(tmp_path, [wobble]), declared_lists=True)


def attacked_record(tmp_path: Path) -> Path:
    """An attacked-part record by the benchmark's own writer, at α = 0.5 on its datasets:
    FedAvg 0.8 without attack, 0.6 under sign flipping, 0.7 under ALIE; the median with
    FedAdam 0.78, 0.77 and 0.75 (each plus seed/1000)."""
    from benchmarks.papers import fedlag_table1

    levels = {"fedavg": {"none": 0.8, "sign_flip": 0.6, "alie": 0.7},
              "median_fedadam": {"none": 0.78, "sign_flip": 0.77, "alie": 0.75}}  # fmt: skip
    records = [
        {"dataset": dataset, "regime": "dirichlet-0.5", "method": method, "attack": attack,
         "fraction": 0.0 if attack == "none" else 0.2, "seed": seed,
         "test_acc": level + seed / 1000, "test_auc": 0.8, "site_acc_worst": 0.5,
         "rounds_to_target": 3, "rounds": 10, "majority_share": 0.6, "seconds": 1.0}
        for seed in range(10) for dataset in fedlag_table1.DATASETS
        for method, by_attack in levels.items() for attack, level in by_attack.items()
    ]  # fmt: skip
    path = tmp_path / "fedlag-table1-attacked-seeds.csv"
    fedlag_table1.write_seed_rows(records, path)
    return path


def test_an_attacked_table1_claim_reads_each_side_under_its_own_attack(tmp_path, monkeypatch):
    from benchmarks.evidence.tables import table1

    monkeypatch.setattr(table1, "ATTACKED_RECORD", attacked_record(tmp_path))
    base = {"kind": "table1", "part": "attacked", "regime": "dirichlet-0.5", "measure": "acc",
            "family": "table1-attacked-test", "adjust": "holm"}  # fmt: skip
    breaks = base | {"id": "P97", "text": "sign flipping lowers FedAvg", "first": "fedavg",
                     "second": "fedavg", "second_attack": "sign_flip"}  # fmt: skip
    holds = base | {"id": "P98", "text": "the median with FedAdam holds", "first_attack": "worst",
                    "first": "median_fedadam", "second": "fedavg", "second_attack": "worst"}  # fmt: skip

    found = claims.verdicts(written(tmp_path, [breaks, holds]), declared_lists=True)

    assert found[0].statistic == (
        "Δ acc at dirichlet-0.5 (fedavg − fedavg under sign_flip) = +0.200 over 10 seeds"
    )
    # the worst of the two attacks on each side: 0.75 (ALIE) against 0.6 (sign flipping)
    assert found[1].statistic.endswith("under worst) = +0.150 over 10 seeds")
    assert all(v.holds for v in found) and "sign-flip p = 0.00195" in found[0].test
    assert table1.table1_complete(holds) and not claims.pending(breaks)
    # a method the record never ran under an attack: pending, never judged
    assert not table1.table1_complete(holds | {"second": "fedadam"})
    with pytest.raises(claims.LedgerError, match="attack 'label_flip'; allowed: none, sign_flip"):
        claims.verdicts(written(tmp_path, [breaks | {"second_attack": "label_flip"}]), declared_lists=True)  # fmt: skip
