"""Pre-registered claims: ``benchmarks/preregistered.yaml`` holds claims stated, with their
thresholds, before the records they rest on existed. The claims of benchmarks/claims.yaml
were written after their data: they guard against regressions and are not confirmatory;
these are the confirmatory ones.

A claim here has the ledger's fields (the same kinds, recomputed by the same code:
:mod:`benchmarks.claims`) and two more: ``records``, the files it will rest on, and
``command``, the command that writes them. ``python -m benchmarks.report --check`` prints
the file's sha256 and, for each claim, the commit that last changed it in this file and the
first commit that added its records. It fails, naming the claim, when the records came
first or the claim changed after they were committed. A claim whose records do not exist
yet is "pre-registered, records pending". Git is read through its command line (``git log``,
``git merge-base --is-ancestor``); without git or in a shallow checkout the order is not
checked, and the check says so in one line.

A pre-registered claim that does not hold is reported as not confirmed in its table of
docs/results.md, never reworded: only the commit order fails the check.
"""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks import claims
from benchmarks.claims import LedgerError

REPO = Path(__file__).resolve().parents[1]
PREREGISTERED = REPO / "benchmarks" / "preregistered.yaml"


@dataclass(frozen=True)
class CommitOrder:
    """What ``report --check`` prints about the pre-registration, and what it fails on."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def load(path: Path = PREREGISTERED) -> list[dict[str, Any]]:
    """The pre-registered claims: the ledger's checks, and for each claim its ``records``
    (a non-empty list of paths from the repository root) and its ``command``."""
    found = claims.load_ledger(path)
    for claim in found:
        records = claim.get("records")
        if not (isinstance(records, list) and records and all(isinstance(r, str) for r in records)):
            raise LedgerError(
                f"{path.name}: claim {claim['id']} needs records: a list of the files it rests "
                "on, from the repository root"
            )
        if not isinstance(claim.get("command"), str):
            raise LedgerError(
                f"{path.name}: claim {claim['id']} needs command: the command that writes "
                "its records"
            )
    return found


def shown(path: Path, repo: Path) -> str:
    return path.relative_to(repo).as_posix() if path.is_relative_to(repo) else path.name


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()


def unchecked_because(repo: Path) -> str | None:
    """Why the commit order cannot be read here (no git, not a checkout, a shallow one),
    or None."""
    try:
        shallow = git(repo, "rev-parse", "--is-shallow-repository")
    except (OSError, subprocess.CalledProcessError):
        return "git is not installed or this is not a git checkout"
    if shallow == "true":
        return "the checkout is shallow (git fetch --unshallow reads the whole history)"
    return None


def claim_history(repo: Path, path: Path, claim_id: str) -> list[tuple[str, Any]]:
    """Each commit that changed ``path``, newest first, with the claim as it stood there
    (None where the file lacked it or was not valid YAML)."""
    relative = path.relative_to(repo).as_posix()
    history = []
    for commit in git(repo, "log", "--format=%H", "--", relative).split():
        try:
            text = git(repo, "show", f"{commit}:{relative}")
            stood = {c.get("id"): c for c in yaml.safe_load(text) or [] if isinstance(c, dict)}
        except (subprocess.CalledProcessError, yaml.YAMLError, TypeError, AttributeError):
            stood = {}
        history.append((commit, stood.get(claim_id)))
    return history


def registered_in(history: list[tuple[str, Any]], claim: dict[str, Any]) -> str | None:
    """The commit that last changed ``claim`` to what it says now: the oldest of the newest
    run of commits holding it as it is. None when the claim as it is was never committed."""
    registered = None
    for commit, stood in history:
        if stood != claim:
            break
        registered = commit
    return registered


def first_added(repo: Path, record: str) -> str | None:
    """The first commit that added ``record`` (a path from the repository root), or None."""
    added = git(repo, "log", "--diff-filter=A", "--reverse", "--format=%H", "--", record)
    return added.split()[0] if added else None


def is_before(repo: Path, first: str, second: str) -> bool:
    """``first`` is an ancestor of ``second`` and not the same commit."""
    if first == second:
        return False
    ancestor = subprocess.run(
        ["git", "merge-base", "--is-ancestor", first, second], cwd=repo, capture_output=True
    )
    return ancestor.returncode == 0


def described(repo: Path, commit: str, width: int = 60) -> str:
    """A commit as its short hash and subject (cut to ``width`` characters)."""
    short, subject = git(repo, "log", "-1", "--format=%h%n%s", commit).split("\n", 1)
    return f"{short} ({subject if len(subject) <= width else subject[: width - 1] + '…'})"


def claim_order(repo: Path, path: Path, claim: dict[str, Any]) -> tuple[str, str | None]:
    """One claim's line of the check and its problem (None when it is in order)."""
    name = claim["id"]
    history = claim_history(repo, path, name)
    registered = registered_in(history, claim)
    said = f"pre-registered in {described(repo, registered)}" if registered else "not yet committed"
    added = {record: first_added(repo, record) for record in claim["records"]}
    committed = {record: commit for record, commit in added.items() if commit}
    if not committed:
        present = [r for r in claim["records"] if (repo / r).exists()]
        if not present:
            return f"{name}: {said}; records pending", None
        line = f"{name}: {said}; records not yet committed ({', '.join(present)})"
        early = f"claim {name} of {path.name}: its records exist before it is committed"
        return line, None if registered else early
    late = [
        r
        for r, commit in committed.items()
        if not (registered and is_before(repo, registered, commit))
    ]
    records = "; ".join(f"{r} added in {described(repo, c)}" for r, c in committed.items())
    line = f"{name}: {said}; {records}"
    if not late:
        return line, None
    stated = [commit for commit, stood in history if stood is not None]
    first_stated = stated[-1] if stated else None
    if first_stated and all(is_before(repo, first_stated, committed[r]) for r in late):
        why = "it changed after its records were committed"
    else:
        why = "its records came first"
    return line, f"claim {name} of {path.name}: {why} ({', '.join(late)})"


def commit_order(repo: Path = REPO, path: Path = PREREGISTERED) -> CommitOrder:
    """The file's sha256 and each claim's order of commits (module docstring)."""
    lines = [f"{shown(path, repo)}: sha256 {sha256(path)}"]
    why = unchecked_because(repo)
    if why:
        return CommitOrder([*lines, f"commit order not checked: {why}"])
    problems = []
    for claim in load(path):
        line, problem = claim_order(repo, path, claim)
        lines.append(line)
        problems += [problem] if problem else []
    return CommitOrder(lines, problems)


def block(path: Path = PREREGISTERED, repo: Path = REPO) -> str:
    """docs/results.md's table of the pre-registered claims: the file's sha256, each claim
    recomputed by the ledger's code once every record the file names exists (the file's
    claims are recomputed together: a family is adjusted over all its members), else
    "records pending", and the commands that write the records."""
    found = load(path)
    ready = all((repo / record).exists() for claim in found for record in claim["records"])
    recomputed = {v.claim: v for v in claims.verdicts(path)} if ready else {}
    lines = [
        f"`{shown(path, repo)}`, sha256 `{sha256(path)}`",
        "",
        "| id | claim | statistic | test | holds |",
        "|---|---|---|---|---|",
    ]
    for claim in found:
        verdict = recomputed.get(claim["id"])
        if verdict is None:
            lines.append(f"| {claim['id']} | {claim['text']} | – | – | records pending |")
        else:
            holds = "yes" if verdict.holds else "**no** (not confirmed)"
            lines.append(
                f"| {claim['id']} | {claim['text']} | {verdict.statistic} | {verdict.test} "
                f"| {holds} |"
            )
    commands = dict.fromkeys((", ".join(c["records"]), c["command"]) for c in found)
    lines += ["", "Records, and the command that writes them:", ""]
    lines += [f"- `{records}`: `{command}`" for records, command in commands]
    return "\n".join(lines) + "\n"
