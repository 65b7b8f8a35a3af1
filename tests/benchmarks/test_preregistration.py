"""Pre-registered claims are committed before their records were committed: the check reads
the order of commits from git and fails naming a claim whose records (or their content,
under any path) came first, a claim edited or deleted after it was registered, and a
rewritten statement of what was seen before registering; a claim whose records are not
written yet is pending, not a failure."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
import yaml

from benchmarks.evidence import preregistration
from benchmarks.evidence.claims import LedgerError

CLAIM = {
    "id": "P1",
    "text": "the median keeps a worst case of at least 0.9",
    "kind": "worst_case",
    "record": "digits-x",
    "method": "median",
    "fraction": 0.2,
    "at_least": 0.9,
    "records": ["results/x-seeds.csv"],
    "command": "python -m benchmarks.robustness.matrix --regime x",
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
    (repo / "results").mkdir(exist_ok=True)
    (repo / "results" / name).write_text("method,seed\nmedian,0\n")


def test_a_claim_committed_before_its_records_is_in_order(repo):
    path = preregister(repo, CLAIM)
    commit(repo, "pre-register P1")
    record(repo)
    commit(repo, "the records")

    order = preregistration.commit_order(repo, path)

    assert order.problems == []
    assert order.lines[1].startswith("registered in ") and "(pre-register P1)" in order.lines[1]
    assert order.lines[2].startswith("P1: pre-registered in ")
    assert "(pre-register P1)" in order.lines[2]
    assert "results/x-seeds.csv first committed in " in order.lines[2]


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
def test_a_threshold_changed_after_registering_fails_naming_the_claim(repo, committed):
    path = preregister(repo, CLAIM)
    commit(repo, "pre-register P1")
    record(repo)
    commit(repo, "the records")
    preregister(repo, CLAIM | {"at_least": 0.8})
    if committed:
        commit(repo, "lower P1's threshold")

    order = preregistration.commit_order(repo, path)

    changed_by = "(lower P1's threshold)" if committed else "the working copy"
    assert len(order.problems) == 2
    assert changed_by in order.problems[0] and "(pre-register P1) registered" in order.problems[0]
    assert order.problems[0].endswith("; a registered file is only appended to")
    assert order.problems[1].startswith("claim P1 of pre.yaml: it differs from the claim ")


def test_a_field_appended_to_the_last_claim_changes_it(repo):
    """Appending keeps the file's start, but a field added under the last claim is part of
    that claim: the claim as registered is compared too."""
    path = preregister(repo, CLAIM)
    commit(repo, "pre-register P1")
    path.write_text(path.read_text() + "  seeds: [0, 4]\n")
    commit(repo, "P1 on five seeds only")

    order = preregistration.commit_order(repo, path)

    assert order.problems == [
        "claim P1 of pre.yaml: it differs from the claim "
        f"{order.lines[1].split()[2]} (pre-register P1) registered"
    ]


def test_evasion_records_committed_earlier_under_another_path_then_renamed_in(repo):
    """The records committed first under another name, the claim registered, then the
    records renamed to the path the claim names: their content was in history before the
    claim, and git's rename detection (--follow) finds their first commit."""
    record(repo, "draft.csv")
    commit(repo, "some numbers")
    path = preregister(repo, CLAIM)
    commit(repo, "pre-register P1")
    git(repo, "mv", "results/draft.csv", "results/x-seeds.csv")
    commit(repo, "the records")

    order = preregistration.commit_order(repo, path)

    assert order.problems == ["claim P1 of pre.yaml: its records came first (results/x-seeds.csv)"]
    assert "first committed in " in order.lines[2] and "as results/draft.csv" in order.lines[2]


def test_evasion_records_copied_in_from_an_older_commit_whatever_their_path(repo):
    """A copy of a file that some earlier commit held, even one since deleted, is found by
    its content (no rename to follow)."""
    record(repo, "draft.csv")
    commit(repo, "some numbers")
    git(repo, "rm", "-q", "results/draft.csv")
    commit(repo, "gone")
    path = preregister(repo, CLAIM)
    commit(repo, "pre-register P1")
    record(repo)  # the same bytes
    commit(repo, "the records")

    order = preregistration.commit_order(repo, path)

    assert order.problems == ["claim P1 of pre.yaml: its records came first (results/x-seeds.csv)"]


def test_evasion_deleting_an_unconfirmed_claim_fails(repo):
    """Two claims registered as one family; once the records are in, the one that does not
    hold is deleted (which would also shrink the other's Holm family)."""
    second = CLAIM | {"id": "P2", "at_least": 0.5}
    path = preregister(repo, CLAIM, second)
    commit(repo, "pre-register P1 and P2")
    record(repo)
    commit(repo, "the records")
    preregister(repo, second)
    commit(repo, "drop P1")

    order = preregistration.commit_order(repo, path)

    assert len(order.problems) == 1
    assert "(drop P1) changes what " in order.problems[0]
    assert "(pre-register P1 and P2) registered (line 1)" in order.problems[0]


def test_evasion_editing_the_statement_of_what_was_seen_before_registering_fails(repo):
    path = repo / "pre.yaml"
    claims = yaml.safe_dump([CLAIM], allow_unicode=True)
    path.write_text("# Seen before registering: nothing of this regime.\n" + claims)
    commit(repo, "pre-register P1")
    record(repo)
    commit(repo, "the records")
    path.write_text("# Seen before registering: one cell, to time it.\n" + claims)
    commit(repo, "a fuller statement")

    order = preregistration.commit_order(repo, path)

    assert len(order.problems) == 1
    assert "(a fuller statement) changes what " in order.problems[0]
    assert "registered (line 1)" in order.problems[0]
    assert order.lines[0].startswith("pre.yaml: sha256 ")
    assert order.lines[1].startswith("registered in ") and "(pre-register P1)" in order.lines[1]


def test_a_claim_appended_later_is_in_order_and_the_hash_at_each_registration_is_shown(repo):
    later = CLAIM | {"id": "P2", "records": ["results/y-seeds.csv"]}
    path = preregister(repo, CLAIM)
    commit(repo, "pre-register P1")
    first = path.read_bytes()
    record(repo)
    commit(repo, "P1's records")
    path.write_text(path.read_text() + yaml.safe_dump([later], allow_unicode=True))
    commit(repo, "pre-register P2")

    order = preregistration.commit_order(repo, path)

    assert order.problems == []
    assert order.lines[1].endswith(f"sha256 there {hashlib.sha256(first).hexdigest()}")
    assert "(pre-register P2)" in order.lines[2]
    assert order.lines[4].endswith("(pre-register P2); results/y-seeds.csv pending")


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
    """The IID CNN's median keeps a worst case of 0.938 (95 % lower bound 0.930): a
    pre-registered claim on that record holds at 0.9 and not at 0.99."""
    records = ["benchmarks/results/robustness-digits-cnn-seeds.csv"]
    on_record = CLAIM | {"record": "digits-cnn", "records": records}
    path = preregister(tmp_path, on_record, on_record | {"id": "P2", "at_least": 0.99})

    table = preregistration.block(path, preregistration.REPO)

    assert (
        "| P1 | the median keeps a worst case of at least 0.9 | 0.938 [0.930, 0.944] [10 seeds] "
        in table
    )
    assert "| 95 % bound 0.930 ≥ 0.99 | **no** (not confirmed) |" in table
    assert table.count("| yes |") == 1
    assert f"- `{records[0]}`: `{CLAIM['command']}`" in table


def test_a_claim_is_recomputed_while_another_claims_records_are_pending(tmp_path):
    """Claims registered later, their records not yet written, leave the earlier claims'
    verdicts standing (what a sentence may cite): each family is recomputed once its own
    records exist."""
    records = ["benchmarks/results/robustness-digits-cnn-seeds.csv"]
    on_record = CLAIM | {"record": "digits-cnn", "records": records}
    later = on_record | {"id": "P2", "records": ["benchmarks/results/not-yet-seeds.csv"]}
    path = preregister(tmp_path, on_record, later)

    assert preregistration.ready(preregistration.load(path)) == {"P1"}
    assert [v.claim for v in preregistration.verdicts(path)] == ["P1"]
    table = preregistration.block(path, preregistration.REPO)
    assert "| P1 | the median keeps a worst case of at least 0.9 | 0.938 " in table
    assert f"| P2 | {CLAIM['text']} | – | – | records pending |" in table


def branch_registering(repo: Path, branch: str, claim: dict, record_name: str) -> None:
    """On ``branch`` (from the current commit): ``claim`` appended and committed, then its
    record committed; back on the main line afterwards."""
    git(repo, "checkout", "-q", "-b", branch)
    path = repo / "pre.yaml"
    path.write_text(path.read_text() + yaml.safe_dump([claim], allow_unicode=True))
    commit(repo, f"pre-register {claim['id']}")
    record(repo, record_name)
    commit(repo, f"{claim['id']}'s records")
    git(repo, "checkout", "-q", "main")


def merged(repo: Path, branch: str, resolved: bytes | None = None) -> None:
    """``branch`` merged into main; a conflict in pre.yaml resolved as ``resolved``."""
    done = subprocess.run(["git", "merge", "-q", "--no-ff", "-m", f"merge {branch}", branch],
                          cwd=repo, capture_output=True)  # fmt: skip
    if done.returncode != 0:
        (repo / "pre.yaml").write_bytes(resolved or b"")
        commit(repo, f"merge {branch}")


@pytest.fixture
def two_branches(repo: Path) -> tuple[Path, dict, dict]:
    """P1 on main; P2 and P3 registered, with their records, on two branches at once."""
    git(repo, "branch", "-M", "main")
    path = preregister(repo, CLAIM)
    commit(repo, "pre-register P1")
    second = CLAIM | {"id": "P2", "records": ["results/y-seeds.csv"]}
    third = CLAIM | {"id": "P3", "records": ["results/z-seeds.csv"]}
    branch_registering(repo, "b2", second, "y-seeds.csv")
    branch_registering(repo, "b3", third, "z-seeds.csv")
    return path, second, third


def test_claims_registered_on_two_branches_and_merged_keep_their_order(two_branches):
    path, _, third = two_branches
    repo = path.parent
    merged(repo, "b2")
    both = (path.read_text() + yaml.safe_dump([third], allow_unicode=True)).encode()
    merged(repo, "b3", resolved=both)

    order = preregistration.commit_order(repo, path)

    assert order.problems == []
    assert [c["id"] for c in preregistration.load(path)] == ["P1", "P2", "P3"]
    assert any(line.startswith("P3: pre-registered in ") and "(pre-register P3)" in line
               for line in order.lines)  # fmt: skip


def test_a_merge_that_drops_a_branchs_registered_claim_fails(two_branches):
    path, _, _ = two_branches
    repo = path.parent
    merged(repo, "b2")
    merged(repo, "b3", resolved=path.read_bytes())  # the conflict resolved as main's side

    order = preregistration.commit_order(repo, path)

    assert len(order.problems) == 1
    assert "(merge b3) changes what " in order.problems[0]
    assert order.problems[0].endswith("; a registered file is only appended to")
