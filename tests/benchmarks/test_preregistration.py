"""Pre-registered claims are committed before their records: the check reads the order of
commits from git and fails naming a claim whose records came first or that changed after
them; a claim whose records are not written yet is pending, not a failure."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
import yaml

from benchmarks import preregistration
from benchmarks.claims import LedgerError

CLAIM = {
    "id": "P1",
    "text": "the median keeps a worst case of at least 0.9",
    "kind": "worst_case",
    "record": "digits-x",
    "method": "median",
    "fraction": 0.2,
    "at_least": 0.9,
    "records": ["results/x-seeds.csv"],
    "command": "python -m benchmarks.robustness --regime x",
}


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def commit(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false",
        "commit", "-q", "-m", message)  # fmt: skip


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q")
    (tmp_path / "results").mkdir()
    (tmp_path / "README").write_text("a repository with a history\n")
    commit(tmp_path, "start")
    return tmp_path


def preregister(repo: Path, *claims: dict) -> Path:
    path = repo / "pre.yaml"
    path.write_text(yaml.safe_dump(list(claims), allow_unicode=True))
    return path


def record(repo: Path, name: str = "x-seeds.csv") -> None:
    (repo / "results" / name).write_text("method,seed\nmedian,0\n")


def test_a_claim_committed_before_its_records_is_in_order(repo):
    path = preregister(repo, CLAIM)
    commit(repo, "pre-register P1")
    record(repo)
    commit(repo, "the records")

    order = preregistration.commit_order(repo, path)

    assert order.problems == []
    assert order.lines[1].startswith("P1: pre-registered in ")
    assert "(pre-register P1)" in order.lines[1] and "(the records)" in order.lines[1]


def test_records_committed_before_the_claim_fail_naming_it(repo):
    record(repo)
    commit(repo, "the records")
    path = preregister(repo, CLAIM)
    commit(repo, "pre-register P1")

    order = preregistration.commit_order(repo, path)

    assert order.problems == ["claim P1 of pre.yaml: its records came first (results/x-seeds.csv)"]


def test_a_claim_and_its_records_in_one_commit_are_out_of_order(repo):
    preregister(repo, CLAIM)
    record(repo)
    commit(repo, "both at once")

    order = preregistration.commit_order(repo, repo / "pre.yaml")

    assert order.problems == ["claim P1 of pre.yaml: its records came first (results/x-seeds.csv)"]


@pytest.mark.parametrize("committed", [True, False])
def test_a_threshold_changed_after_the_records_fails_naming_the_claim(repo, committed):
    path = preregister(repo, CLAIM)
    commit(repo, "pre-register P1")
    record(repo)
    commit(repo, "the records")
    preregister(repo, CLAIM | {"at_least": 0.8})
    if committed:
        commit(repo, "lower P1's threshold")

    order = preregistration.commit_order(repo, path)

    assert order.problems == [
        "claim P1 of pre.yaml: it changed after its records were committed (results/x-seeds.csv)"
    ]


def test_a_claim_added_later_leaves_the_earlier_in_order_and_is_pending(repo):
    later = CLAIM | {"id": "P2", "records": ["results/y-seeds.csv"]}
    path = preregister(repo, CLAIM)
    commit(repo, "pre-register P1")
    record(repo)
    commit(repo, "P1's records")
    preregister(repo, CLAIM, later)
    commit(repo, "pre-register P2")

    order = preregistration.commit_order(repo, path)

    assert order.problems == []
    assert "(pre-register P1)" in order.lines[1]
    assert order.lines[2].endswith("(pre-register P2); records pending")


def test_records_written_for_an_uncommitted_claim_fail_and_pending_ones_do_not(repo):
    path = preregister(repo, CLAIM)

    pending = preregistration.commit_order(repo, path)
    record(repo)
    written = preregistration.commit_order(repo, path)

    assert pending.problems == []
    assert pending.lines[1] == "P1: not yet committed; records pending"
    assert written.problems == ["claim P1 of pre.yaml: its records exist before it is committed"]


def test_the_hash_shown_is_the_files_sha256(repo):
    path = preregister(repo, CLAIM)

    order = preregistration.commit_order(repo, path)

    assert order.lines[0] == f"pre.yaml: sha256 {hashlib.sha256(path.read_bytes()).hexdigest()}"


def test_without_git_history_the_order_is_not_checked_and_said_so(repo, tmp_path_factory):
    preregister(repo, CLAIM)
    commit(repo, "pre-register P1")
    shallow = tmp_path_factory.mktemp("clone") / "shallow"
    git(repo, "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow))
    plain = tmp_path_factory.mktemp("plain")
    preregister(plain, CLAIM)

    in_shallow = preregistration.commit_order(shallow, shallow / "pre.yaml")
    in_plain = preregistration.commit_order(plain, plain / "pre.yaml")

    assert in_shallow.problems == [] and in_plain.problems == []
    assert in_shallow.lines[1].startswith("commit order not checked: the checkout is shallow")
    assert in_plain.lines[1] == (
        "commit order not checked: git is not installed or this is not a git checkout"
    )


@pytest.mark.parametrize(
    ("missing", "said"),
    [("records", "claim P1 needs records"), ("command", "claim P1 needs command")],
)
def test_a_claim_without_its_records_or_command_is_refused_in_one_line(tmp_path, missing, said):
    path = preregister(tmp_path, {k: v for k, v in CLAIM.items() if k != missing})

    with pytest.raises(LedgerError, match=said):
        preregistration.load(path)


def test_a_claim_whose_records_exist_is_recomputed_by_the_ledgers_code(tmp_path):
    """The IID CNN's median keeps a worst case of 0.938 (95 % lower bound 0.931): a
    pre-registered claim on that record holds at 0.9 and not at 0.99."""
    records = ["benchmarks/results/robustness-digits-cnn-seeds.csv"]
    on_record = CLAIM | {"record": "digits-cnn", "records": records}
    path = preregister(tmp_path, on_record, on_record | {"id": "P2", "at_least": 0.99})

    table = preregistration.block(path, preregistration.REPO)

    assert (
        "| P1 | the median keeps a worst case of at least 0.9 | 0.938 ± 0.007 [10 seeds] " in table
    )
    assert "| 95 % bound 0.931 ≥ 0.99 | **no** (not confirmed) |" in table
    assert table.count("| yes |") == 1
    assert f"- `{records[0]}`: `{CLAIM['command']}`" in table
