"""Pre-registered claims: ``benchmarks/preregistered.yaml`` holds claims stated, with their
thresholds, in a commit before the one that committed the records they rest on. The claims
of benchmarks/claims.yaml were written after their data: they guard against regressions
and are not confirmatory; these are the confirmatory ones.

A claim here has the ledger's fields (the same kinds, recomputed by the same code:
:mod:`benchmarks.evidence.claims`) and two more: ``records``, the files it will rest on, and
``command``, the command that writes them. ``python -m benchmarks.evidence.report --check`` prints,
for each commit that registered claims, the sha256 of the whole file as that commit left
it (comments included: what was seen before registering is part of the registration), and
for each claim the commit that registered it and the first commit of each of its records.
"Before" is ancestry in git's commit graph, the order git can show; it fails, naming the
claim or the commit, when

- a commit's version of the file does not start with its parent's, or a merge's is not
  its first parent's followed by what each other branch appended since they parted (so
  claims registered on two branches at once are merged by keeping both): the file is only
  ever appended to, so no registered claim is deleted or edited and no statement of what
  was seen before registering is rewritten (the working copy included; every commit that
  touched the file on any branch is read, ``git log --full-history``);
- a claim differs from the claim as its registering commit left it (a field appended to
  the file's last claim, say);
- a record was first committed (under any path it had before a rename: ``git log
  --follow``) in the registering commit or before it, or its content (any version of it,
  its rename sources' and the working copy's) is a file of any commit the registering
  commit descends from, whatever path held it (``git rev-list --objects``, once per
  registering commit);
- a record exists, uncommitted, beside a claim not yet committed.

A claim whose records do not exist yet is "pre-registered, records pending". Git is read
through its command line; without git or in a shallow checkout the order is not checked,
and the check says so in one line.

A pre-registered claim that does not hold is reported as not confirmed in its table of
docs/results.md, never reworded: only the commit order fails the check.
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.evidence import claims
from benchmarks.evidence.claims import LedgerError

REPO = Path(__file__).resolve().parents[2]
PREREGISTERED = REPO / "benchmarks" / "preregistered.yaml"


@dataclass(frozen=True)
class CommitOrder:
    """What ``report --check`` prints about the pre-registration, and what it fails on."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def load(path: Path = PREREGISTERED) -> list[dict[str, Any]]:
    """The pre-registered claims: the ledger's checks, and for each claim its ``records``
    (a non-empty list of paths from the repository root) and its ``command``."""
    found = claims.load_ledger(path, declared_lists=True)
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


def file_versions(repo: Path, path: Path) -> list[tuple[str, bytes]]:
    """Each commit that changed ``path`` on any line of history (``--full-history``: a merge
    that dropped one side's change is listed too), ancestors first, with the file as it
    left it."""
    relative = path.relative_to(repo).as_posix()
    commits = git(
        repo, "log", "--full-history", "--topo-order", "--reverse", "--format=%H", "--", relative
    ).split()
    return [(commit, shown_at(repo, commit, relative)) for commit in commits]


def shown_at(repo: Path, commit: str, relative: str) -> bytes:
    """``relative`` as ``commit`` holds it (empty where it holds no such file)."""
    found = subprocess.run(
        ["git", "show", f"{commit}:{relative}"], cwd=repo, capture_output=True, check=False
    )
    return found.stdout if found.returncode == 0 else b""


def claims_in(text: bytes) -> dict[str, Any]:
    """The claims of one version of the file by id ({} where it is not a list of claims)."""
    try:
        found = yaml.safe_load(text) or []
    except yaml.YAMLError:
        return {}
    return {c.get("id"): c for c in found if isinstance(c, dict)} if isinstance(found, list) else {}


def parents(repo: Path, commit: str) -> list[str]:
    return git(repo, "rev-list", "--parents", "-n", "1", commit).split()[1:]


def grown_from(repo: Path, commit: str, relative: str) -> bytes:
    """What ``commit``'s version of the file starts with if it only appended: its parent's
    version; for a merge, the first parent's version plus what each other parent appended
    since their merge base (claims registered on two branches at once are both kept, the
    first parent's first), which must then be the whole file."""
    first, *others = parents(repo, commit) or [""]
    grown = shown_at(repo, first, relative) if first else b""
    for other in others:
        base = shown_at(repo, git(repo, "merge-base", first, other).strip(), relative)
        theirs = shown_at(repo, other, relative)
        grown += theirs[len(base) :] if theirs.startswith(base) else theirs
    return grown


def last_change(repo: Path, commit: str, relative: str) -> str:
    """The commit that last changed the file on ``commit``'s first parent's line."""
    first = parents(repo, commit)[:1]
    found = git(repo, "log", "-1", "--format=%H", *first, "--", relative).strip() if first else ""
    return described(repo, found) if found else "the history before it"


def first_changed_line(text: bytes, grown: bytes) -> int:
    """The first line at which ``grown`` does not continue ``text``."""
    pairs = zip(text.splitlines(), grown.splitlines(), strict=False)
    different = (number for number, (a, b) in enumerate(pairs, 1) if a != b)
    return next(different, min(text.count(b"\n"), grown.count(b"\n")) + 1)


def growth_problems(
    repo: Path, path: Path, versions: list[tuple[str, bytes]], current: bytes
) -> list[str]:
    """Where a committed version of the file, or the working copy, is not what came before
    it with claims appended (:func:`grown_from`; a merge must be exactly that), and the
    last committed version does not start the working copy. A registration is only ever
    appended to, whatever branches it was appended on."""
    relative, found = path.relative_to(repo).as_posix(), []
    for commit, text in versions:
        before = grown_from(repo, commit, relative)
        merge = len(parents(repo, commit)) > 1
        if text == before or (not merge and text.startswith(before)):
            continue
        found.append(
            f"{path.name}: {described(repo, commit)} changes what "
            f"{last_change(repo, commit, relative)} registered (line "
            f"{first_changed_line(before, text)}); a registered file is only appended to"
        )
    head = shown_at(repo, "HEAD", relative)
    if not current.startswith(head):
        last = git(repo, "log", "-1", "--format=%H", "HEAD", "--", relative).strip()
        found.append(
            f"{path.name}: the working copy changes what {described(repo, last)} registered "
            f"(line {first_changed_line(head, current)}); a registered file is only appended to"
        )
    return found


@dataclass(frozen=True)
class RecordHistory:
    """A record's commits through its renames (``git log --follow``): the first, the paths
    it had and every content it had (blob ids, the working copy's included)."""

    first: str | None
    paths: list[str]
    blobs: frozenset[str]


def record_history(repo: Path, record: str) -> RecordHistory:
    """The commits of ``record``, followed through renames, and its contents."""
    log = git(repo, "log", "--follow", "--reverse", "--format=commit %H", "--raw",
              "--no-abbrev", "--", record)  # fmt: skip
    commits, paths, blobs = [], [], set()
    for line in log.splitlines():
        if line.startswith("commit "):
            commits.append(line.split()[1])
        elif line.startswith(":"):
            fields, *names = line.split("\t")
            _, _, old, new, _ = fields.split()
            blobs |= {old, new} - {"0" * 40}
            paths += [n for n in names if n not in paths]
    if (repo / record).is_file():
        blobs.add(git(repo, "hash-object", record))
    return RecordHistory(commits[0] if commits else None, paths, frozenset(blobs))


@functools.cache
def _objects(repo: Path, commit: str) -> frozenset[str]:
    return frozenset(
        line.split()[0] for line in git(repo, "rev-list", "--objects", commit).splitlines()
    )


def held_before(repo: Path, commit: str, blobs: frozenset[str]) -> bool:
    """Whether any of ``blobs`` is a file of ``commit`` or of a commit it descends from."""
    return bool(blobs & _objects(repo, commit))


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


def registered_in(versions: list[tuple[str, bytes]], claim_id: str) -> tuple[str, Any] | None:
    """The first commit whose version of the file holds the claim, and the claim there."""
    for commit, text in versions:
        found = claims_in(text).get(claim_id)
        if found is not None:
            return commit, found
    return None


def record_said(item: tuple[str, RecordHistory]) -> str:
    """How a claim's line names one of its records."""
    record, history = item
    if history.first is None:
        return f"{record} not yet committed" if history.blobs else f"{record} pending"
    first = history.paths[0]
    return f"{record} first committed in {history.first[:7]}" + (
        f" as {first}" if first != record else ""
    )


def claim_order(
    repo: Path,
    path: Path,
    claim: dict[str, Any],
    versions: list[tuple[str, bytes]],
    known: dict[str, RecordHistory],
) -> tuple[str, str | None]:
    """One claim's line of the check and its problem (None when it is in order);
    ``known`` holds the records' histories read so far (claims share records)."""
    name, where = claim["id"], f"claim {claim['id']} of {path.name}"
    registered = registered_in(versions, name)
    for record in claim["records"]:
        if record not in known:
            known[record] = record_history(repo, record)
    histories = {record: known[record] for record in claim["records"]}
    if registered is None:
        present = [r for r, h in histories.items() if h.blobs]
        if not present:
            return f"{name}: not yet committed; records pending", None
        line = f"{name}: not yet committed; records not yet committed ({', '.join(present)})"
        return line, f"{where}: its records exist before it is committed"
    commit, as_registered = registered
    said = f"pre-registered in {described(repo, commit)}"
    if as_registered != claim:
        return (
            f"{name}: {said}",
            f"{where}: it differs from the claim {described(repo, commit)} registered",
        )
    line = f"{name}: {said}; " + "; ".join(map(record_said, histories.items()))
    early = [r for r, h in histories.items()
             if (h.first and not is_before(repo, commit, h.first))
             or held_before(repo, commit, h.blobs)]  # fmt: skip
    if not early:
        return line, None
    return line, f"{where}: its records came first ({', '.join(early)})"


def commit_order(repo: Path = REPO, path: Path = PREREGISTERED) -> CommitOrder:
    """The file's sha256 at each commit that registered claims, and each claim's order of
    commits (module docstring)."""
    current = path.read_bytes()
    lines = [f"{shown(path, repo)}: sha256 {hashlib.sha256(current).hexdigest()}"]
    why = unchecked_because(repo)
    if why:
        return CommitOrder([*lines, f"commit order not checked: {why}"])
    versions = file_versions(repo, path)
    problems = growth_problems(repo, path, versions, current)
    shown_texts: set[bytes] = set()
    for commit, text in versions:
        if text in shown_texts:  # a merge that brought no claim of its own
            continue
        shown_texts.add(text)
        lines.append(
            f"registered in {described(repo, commit)}: the whole file's sha256 there "
            f"{hashlib.sha256(text).hexdigest()}"
        )
    known: dict[str, RecordHistory] = {}
    for claim in load(path):
        line, problem = claim_order(repo, path, claim, versions, known)
        lines.append(line)
        problems += [problem] if problem else []
    return CommitOrder(lines, problems)


def ready(found: list[dict[str, Any]], repo: Path = REPO) -> set[str]:
    """The ids of the claims that can be recomputed: those whose records exist and hold
    what they count (:func:`benchmarks.claims.pending`), and those of every other claim
    of their family (a family is adjusted over all its members, so
    it is recomputed whole or not at all)."""

    def recorded(claim: dict[str, Any]) -> bool:
        present = all((repo / record).exists() for record in claim["records"])
        return present and not claims.pending(claim)

    families: dict[str, list[dict[str, Any]]] = {}
    for claim in found:
        families.setdefault(claim.get("family") or claim["id"], []).append(claim)
    return {
        claim["id"]
        for members in families.values()
        if all(recorded(member) for member in members)
        for claim in members
    }


def verdicts(path: Path = PREREGISTERED, repo: Path = REPO) -> list[claims.Verdict]:
    """The pre-registered claims whose records exist (:func:`ready`), recomputed."""
    return claims.verdicts(path, declared_lists=True, only=ready(load(path), repo))


def block(path: Path = PREREGISTERED, repo: Path = REPO) -> str:
    """docs/results.md's table of the pre-registered claims: the file's sha256, each claim
    recomputed by the ledger's code once the records of its family exist (a family is
    adjusted over all its members), else "records pending", and the commands that write
    the records."""
    found = load(path)
    recomputed = {v.claim: v for v in verdicts(path, repo)}
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
