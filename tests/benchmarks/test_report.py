"""docs/results.md's robustness tables are the committed per-seed records, recomputed:
none is typed by hand, and a table that no longer matches its records fails here."""

from __future__ import annotations

import pytest

from benchmarks.evidence import report
from benchmarks.evidence.tables.paired import Paired, against_block
from benchmarks.evidence.tables.records import results_json, with_halts
from benchmarks.evidence.tables.robustness_matrix import stopped, stopped_count


def test_every_generated_block_of_the_results_matches_its_records():
    text = report.DOC.read_text()
    names = report.BLOCK.findall(text)
    assert {name for _, name, *_ in names} == set(report.BLOCKS)  # every table is there

    _, changed = report.regenerated(text)

    assert changed == [], f"stale: {changed}; run python -m benchmarks.evidence.report"


def test_a_hand_edit_inside_a_block_is_caught_and_an_unknown_block_refused():
    text = report.DOC.read_text()
    name = next(iter(report.BLOCKS))
    start = text.index(f"<!-- report:{name} -->\n") + len(f"<!-- report:{name} -->\n")
    edited = text[:start] + "| typed | 0.99 |\n" + text[start:]

    fixed, changed = report.regenerated(edited)

    assert changed == [name] and fixed == text
    with pytest.raises(KeyError, match="unknown generated block 'nope'"):
        report.regenerated("<!-- report:nope -->\nx\n<!-- /report:nope -->")


def test_every_claim_of_the_ledger_holds_and_is_cited():
    assert report.problems(report.DOC.read_text()) == []


def test_a_claim_that_no_longer_holds_fails_the_check(tmp_path):
    import yaml

    from benchmarks.evidence import claims

    ledger = claims.load_ledger()
    broken = next(c for c in ledger if c["id"] == "C2")
    broken["at_least"] = 0.99  # the distance CUSUM's worst case at a fifth is 0.93
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(ledger, allow_unicode=True))

    found = report.problems(report.DOC.read_text(), ledger=path)

    assert len(found) == 1 and found[0].startswith("claim C2 no longer holds: 0.933 [0.923")


def test_a_claim_read_off_a_paired_table_is_held_to_the_tables_holm_adjustment(tmp_path):
    """FedAvg's worst case beats the median's at α = 0.1 in a sign-flip test alone
    (p = 0.0156), but not after Holm over the 33 tests of the table it is read from
    (0.205): named with its table, the claim fails. A table row it does not have, or a
    table the report does not make, is refused naming what is allowed."""
    import yaml

    from benchmarks.evidence import claims

    claim = {
        "id": "C99", "text": "FedAvg beats the median", "kind": "better",
        "record": "digits-dirichlet-0.1", "first": "fedavg", "second": "median",
        "fraction": 0.2, "statistic": "worst", "table": "robustness-digits-noniid-paired",
        "row": "0.1", "family": "robustness-digits-noniid-paired", "adjust": "holm",
    }  # fmt: skip
    path = tmp_path / "claims.yaml"

    def verdict(claim: dict) -> claims.Verdict:
        path.write_text(yaml.safe_dump([claim]))
        return claims.verdicts(path)[0]

    in_table = verdict(claim)

    assert claims.better(claim).p == pytest.approx(0.015625)
    assert not in_table.holds and "Holm over 33 tests" in in_table.test
    assert "= 0.205 ≥ 0.05" in in_table.test
    with pytest.raises(ValueError, match=r"row '0\.3' holds no test of fedavg with median"):
        verdict(claim | {"row": "0.3"})
    path.write_text(yaml.safe_dump([claim | {"table": "nope", "row": "0.1"}]))
    with pytest.raises(ValueError, match=r"names table 'nope'.*allowed: fedlag-stability-paired"):
        claims.load_ledger(path)


@pytest.mark.parametrize(
    ("broken", "said"),
    [
        ("- id: C1\n  text: x\n  kind: worst_case\n", "claim C1 (worst_case) lacks the field"),
        ("- id: C1\n  kind: [\n", "not valid YAML"),
        ("C1: at a fifth\n", "must be a list of claims, each with id, text and kind"),
    ],
)
def test_a_broken_ledger_stops_the_check_in_one_line(broken, said, tmp_path, monkeypatch):
    from benchmarks.evidence import claims

    ledger = tmp_path / "claims.yaml"
    ledger.write_text(broken)
    monkeypatch.setattr(claims, "LEDGER", ledger)
    monkeypatch.setattr("sys.argv", ["report", "--check"])

    with pytest.raises(SystemExit) as exit_:
        report.main()

    message = str(exit_.value.code)
    assert message.startswith("claims.yaml: ") and said in message and "\n" not in message


def test_a_drop_claim_pairs_a_methods_clean_and_attacked_runs_by_seed():
    """Under mild label skew (α = 1, 10 seeds) label flipping lowers FedAvg's accuracy in
    every seed; ALIE's does not reach 0.05; five seeds can never reach it."""
    from benchmarks.evidence import claims

    claim = {
        "id": "C99", "text": "label flipping costs FedAvg", "kind": "drop",
        "record": "digits-dirichlet-1", "method": "fedavg", "attack": "label_flip",
        "fraction": 0.2,
    }  # fmt: skip

    flipped = claims.drop(claim)
    assert flipped.in_direction and flipped.p == pytest.approx(2 / 2**10)
    assert flipped.statistic == "Δ drop of fedavg (no attack − label_flip) = +0.123 over 10 seeds"
    assert claims.drop(claim | {"attack": "alie"}).p >= 0.05
    assert claims.drop(claim | {"record": "digits"}).p >= 0.0625  # the matrix: five seeds


def test_a_stability_claim_is_tested_seed_by_seed_in_its_direction():
    """FedLag ends lower than FedAvg at α = 0.1 in all ten seeds (C39): that holds, and
    the same claim turned around (higher) points the other way on the same records."""
    from benchmarks.evidence import claims

    lower = next(c for c in claims.load_ledger() if c["id"] == "C39")
    higher = {k: v for k, v in lower.items() if k != "lower"} | {"higher": True}

    assert claims.stability(lower).in_direction and claims.stability(lower).p < 0.05
    assert not claims.stability(higher).in_direction
    assert claims.stability(lower).statistic.endswith("over 10 seeds")


def test_a_cited_id_the_ledger_lacks_and_an_uncited_claim_are_named():
    from benchmarks.evidence import claims

    ledger = claims.load_ledger()
    text = report.DOC.read_text().replace("[C1]", "[C99]")

    problems = claims.citation_problems(text, ledger)

    assert problems == [
        "C99 is cited but not in the ledger",
        "C1 is in the ledger but no sentence cites it",
    ]


def test_a_citation_wrapped_across_lines_cites_every_id_in_it():
    from benchmarks.evidence import claims

    ledger = [{"id": "C1"}, {"id": "C2"}, {"id": "C3"}]

    assert claims.citation_problems("holds [C1,\nC2, C3].", ledger) == []
    assert claims.citation_problems("holds [C1, C3].", ledger) == [
        "C2 is in the ledger but no sentence cites it"
    ]


def test_a_paired_table_is_one_family_holm_adjusts_over_every_test_of_it():
    """Ten seeds all one way give p = 2/1024; over three regimes' six tests Holm makes it
    six times that (0.0117), whatever regime each test belongs to."""
    import numpy as np

    one_way = (np.full(10, 0.1), 2 / 1024)
    tests = [(m, alpha, one_way) for alpha in ("0.1", "0.5", "1") for m in ("median", "krum")]
    paired = Paired(tests, "fedavg", "α")

    table = against_block(paired)

    assert paired.families() == [list(range(6))]
    assert [line.split(" | ")[4] for line in table.splitlines()[2:]] == ["0.0117"] * 6
    assert "| median | 0.1 | 0.100 ± 0.000 [10] | 0.00195 | 0.0117 | – |" in table


def test_the_fault_table_of_the_operations_guide_is_its_record():
    text = report.OPERATIONS.read_text()
    names = {name for _, name, *_ in report.BLOCK.findall(text)}
    assert names == set(report.OPERATIONS_BLOCKS) == {"container-faults"}

    _, changed = report.regenerated(text, report.OPERATIONS_BLOCKS, report.OPERATIONS)

    assert changed == [], "stale: run python -m benchmarks.evidence.report"
    record = results_json("container-faults")
    faults = [name for name, fault in record.items() if isinstance(fault, dict)]
    assert len(faults) == 8 and "failed" not in record  # every fault ran, and none failed
    assert all(f"| {name} |" in text for name in faults)


def test_a_diverged_or_halted_run_is_scored_at_chance_and_named_beside_its_cell():
    """A run that raised is a loss, never dropped; the tables say which way it stopped."""

    def run(seed: int, error: str = "", auc: float = 0.8) -> dict:
        return {"method": "fedavg", "attack": "opt_ipm", "fraction": 0.2, "seed": seed,
                "test_acc": 0.7, "test_auc": auc, "majority_share": 0.73, "error": error}  # fmt: skip

    diverged = "ModelDiverged: round 2: the model's outputs are NaN or infinite for 156 of 156"
    halted = "ValueError: krum with f=8 needs n_clients > 2f + 2 = 18, got 12"
    rows = with_halts(
        [run(0), run(1, diverged, auc=None), run(2, halted, auc=None), run(3, diverged, None)]
    )

    assert [r["test_auc"] for r in rows] == [0.8, 0.5, 0.5, 0.5]
    assert [r["halted"] for r in rows] == [False, True, True, True]
    assert stopped_count(rows) == " (2 diverged, 1 halted)"
    assert stopped(rows) == " diverges" and stopped([rows[2]]) == " halts"
    assert stopped_count(rows[:1]) == stopped(rows[:1]) == ""
