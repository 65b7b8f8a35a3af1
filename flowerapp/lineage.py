"""Each site's data lineage, as the hub hears it: every answer a site sends carries the
SHA-256 of the data it answered from (its ``.npz`` file's, or its label table's and image
files') and its training and held-out images per class (``lineage`` record; never an
image). The hub keeps what each site said, exchange by exchange, so that a model version
names exactly which data each site trained on, and a site whose data changed during the
run is named with the rounds it trained and scored on either side of the change."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["SiteLineage", "describe_rounds", "round_spans"]


@dataclass
class _Seen:
    sha256: str
    train: list[int]  # training images per class
    test: list[int]  # held-out images per class
    trained: list[int] = field(default_factory=list)  # rounds it trained from this data
    scored: list[int] = field(default_factory=list)  # rounds whose model it scored (0: initial)


@dataclass
class SiteLineage:
    """What each site (by client id) said it answered from, in the order it said it: a new
    entry each time a site's digest differs from its last one."""

    seen: dict[int, list[_Seen]] = field(default_factory=dict)

    def record(
        self, client_id: int, sha256: str, *, train: list[int], test: list[int],
        trained: int | None = None, scored: int | None = None,
    ) -> str | None:  # fmt: skip
        """Note one answer's lineage (``trained``: the round it trained; ``scored``: the
        round whose model it scored); a line saying how the site's data changed when its
        digest is not the one it answered from before (else None)."""
        history = self.seen.setdefault(client_id, [])
        new = not history or history[-1].sha256 != sha256
        if new:
            history.append(_Seen(sha256, list(train), list(test)))
        entry = history[-1]
        for rounds, round_number in ((entry.trained, trained), (entry.scored, scored)):
            if round_number is not None and round_number not in rounds:
                rounds.append(round_number)
        if not new or len(history) == 1:
            return None
        return (
            f"site {client_id}'s data changed during the run: {history[-2].sha256[:12]} "
            f"({describe_rounds(history[-2])}) became {sha256[:12]} ({describe_rounds(entry)})"
        )

    @classmethod
    def from_json(cls, saved: dict[str, list[dict[str, Any]]]) -> SiteLineage:
        """The lineage :meth:`to_json` wrote (an earlier part of a resumed run)."""
        return cls(
            {int(client): [_Seen(**entry) for entry in history]
             for client, history in saved.items()}
        )  # fmt: skip

    def extend(self, later: SiteLineage) -> None:
        """Add what the sites said after this (the part of a run after it was resumed)."""
        for client_id, history in sorted(later.seen.items()):
            for seen in history:
                counts = {"train": seen.train, "test": seen.test}
                self.record(client_id, seen.sha256, **counts)
                for round_number in seen.trained:
                    self.record(client_id, seen.sha256, **counts, trained=round_number)
                for round_number in seen.scored:
                    self.record(client_id, seen.sha256, **counts, scored=round_number)

    def changed(self) -> list[int]:
        """The client ids whose data changed during the run."""
        return [client_id for client_id, history in sorted(self.seen.items()) if len(history) > 1]

    def test_majority_share(self) -> float | None:
        """The share of the most frequent class in the sites' pooled held-out splits, as
        each site last said them (what a majority-class predictor scores there; None with
        no held-out image)."""
        counts = [history[-1].test for history in self.seen.values()]
        total = [sum(column) for column in zip(*counts, strict=True)] if counts else []
        return max(total) / sum(total) if sum(total) else None

    def to_json(self) -> dict[str, list[dict[str, Any]]]:
        """Per client id (a string, as JSON keys are): the data it answered from, in order,
        with the rounds it trained and scored on each."""
        return {
            str(client_id): [asdict(seen) for seen in history]
            for client_id, history in sorted(self.seen.items())
        }


def describe_rounds(seen: _Seen | dict[str, Any]) -> str:
    """``trained rounds 1-3, scored rounds 1-2`` (what a site did with one version of its
    data), or ``no round`` (it only answered a pre-test)."""
    entry = asdict(seen) if isinstance(seen, _Seen) else seen
    parts = [
        f"{what} round{'s' if len(entry[what]) > 1 else ''} {round_spans(entry[what])}"
        for what in ("trained", "scored")
        if entry[what]
    ]
    return ", ".join(parts) or "no round"


def round_spans(rounds: Sequence[int]) -> str:
    """``1-3, 5``: sorted rounds, consecutive ones as a span."""
    spans: list[list[int]] = []
    for number in sorted(rounds):
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
