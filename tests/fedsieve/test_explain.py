"""``fedsieve explain``: why a client counted less in a round, read from the trail."""

import csv

from fedsieve.cli import main
from fedsieve.explain import explain_row

ROUND = [
    {"round": "1", "client": "0", "num_samples": "30", "malicious": "False", "excluded": "False",
     "reason": "", "message": "", "score": "1.0", "threshold": "2.5", "effective_weight": "0.5"},
    {"round": "1", "client": "1", "num_samples": "30", "malicious": "True", "excluded": "True",
     "reason": "pid_made", "message": "", "score": "4.0", "threshold": "2.5", "effective_weight": "0.0"},
    {"round": "1", "client": "2", "num_samples": "30", "malicious": "False", "excluded": "False",
     "reason": "", "message": "", "score": "2.0", "threshold": "2.5", "effective_weight": "0.5"},
]  # fmt: skip


def test_an_excluded_client_is_explained_by_its_filter_score_and_weight():
    text = explain_row(ROUND[1], ROUND)

    assert "malicious in truth: yes" in text
    assert "excluded by the filter pid_made: score 4 above the threshold 2.5" in text
    assert "weight in the aggregate: 0.0000 (round average 0.3333 over 3 clients)" in text
    assert "score: 4 (round median 2; rank 1 of 3, highest first)" in text


def test_validation_at_the_sites_is_explained_by_the_votes_with_every_loss():
    common = {"round": "2", "num_samples": "40", "malicious": "False", "reason": "",
              "message": "", "voters": "2", "val_n": "12"}  # fmt: skip
    rows = [
        common | {"client": "0", "excluded": "False", "votes": "0", "contribution": "0.05",
                  "val_loss": "0.60", "val_loss_without_0": "0.64", "val_loss_without_2": "0.41"},
        common | {"client": "1", "excluded": "False", "votes": "1", "contribution": "0.01",
                  "val_loss": "0.55", "val_loss_without_0": "0.58", "val_loss_without_2": "0.40"},
        common | {"client": "2", "excluded": "True", "reason": "site_validation", "votes": "2",
                  "contribution": "-0.17", "malicious": "True", "val_loss": "0.90",
                  "val_loss_without_0": "0.95", "val_loss_without_2": "1.20"},
    ]  # fmt: skip

    flipper, kept = explain_row(rows[2], rows), explain_row(rows[1], rows)

    assert (
        "excluded by the filter site_validation: 2 of the 2 other sites found the round's"
        in flipper
    )
    assert "contribution: -0.17 (round median 0.01; rank 3 of 3, highest first)" in flipper
    assert "val_loss_without_2: 1.2 (round median 0.41" in flipper
    assert "validation at the sites: 1 of the 2 other sites voted against it" in kept


def test_a_client_a_selecting_rule_passed_over_is_said_so():
    row = ROUND[0] | {"selected": "False", "krum_score": "9.0"}

    assert "not selected by the aggregation rule" in explain_row(row, [row])


def test_the_command_reads_the_trail_and_refuses_a_client_not_sampled(tmp_path, capsys):
    trail = tmp_path / "exclusions.csv"
    with trail.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(ROUND[0]))
        writer.writeheader()
        writer.writerows(ROUND)

    assert main(["explain", "--round", "1", "--client", "1", "--trail", str(trail)]) == 0
    assert "pid_made" in capsys.readouterr().out
    assert main(["explain", "--round", "1", "--client", "7", "--trail", str(trail)]) == 2
    assert "client 7 was not sampled in round 1; sampled: 0, 1, 2" in capsys.readouterr().err
    assert main(["explain", "--round", "99", "--client", "1", "--trail", str(trail)]) == 2
    assert f"{trail} has no round 99; it holds round 1\n" in capsys.readouterr().err


def test_at_real_sites_a_site_is_named_and_no_ground_truth_is_claimed(tmp_path, capsys):
    sites = [row | {"site": f"hospital-{'abc'[int(row['client'])]}", "malicious": "False"}
             for row in ROUND]  # fmt: skip
    trail = tmp_path / "exclusions.csv"
    with trail.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(sites[0]))
        writer.writeheader()
        writer.writerows(sites)

    assert main(["explain", "--round", "1", "--site", "hospital-b", "--trail", str(trail)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("round 1, site hospital-b (30 samples)\n")
    assert "malicious" not in text and "client" not in text.splitlines()[0]
    assert main(["explain", "--round", "1", "--client", "1", "--trail", str(trail)]) == 0
    assert capsys.readouterr().out == text
    assert main(["explain", "--round", "1", "--site", "hospital-z", "--trail", str(trail)]) == 2
    err = capsys.readouterr().err
    assert (
        "site hospital-z was not sampled in round 1; sampled: hospital-a, hospital-b, hospital-c"
        in err
    )
