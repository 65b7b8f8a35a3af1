"""Every figure in the results is generated or cited: docs/results.md and README.md may
state a result in digits only inside a generated block (``<!-- report:NAME -->``, written
from a committed record by ``python -m benchmarks.evidence.report``) or in a sentence that cites a
claim of the ledger (``[C12]``, or a pre-registered ``[P1]``) whose check passes.
``python -m benchmarks.evidence.report --check`` fails naming the line of every other figure.

What counts as a figure. A number written in digits that can state a result:

- a number with a decimal part or an exponent: ``0.731``, ``12.5``, ``1e13``, ``0.42M``;
- a number with a percent sign, a times sign (``6×``; ``512×512`` is a size) or a unit of
  time, size or rate (``s``, ``ms``, ``min``, ``h``, ``GB``, ``MB``, ``images/s`` ...);
- a count out of a total: ``3 of 10``, ``3/10``;
- a number beside ``±`` or ``≈``.

What does not, and why:

- a bare integer: it counts what was set up (clients, rounds, seeds) or names something (a
  year, a size). A result that is a count is written out of its total (``3 of 10``), so
  this rule sees it;
- a number that is part of a name: ``H100``, ``ResNet-18``, ``C39``, ``float32``;
- a reference to a part of a paper or a document: ``Sec. 5.3``, ``Eq. 36``, ``Table 4``,
  ``Figure 2``, ``Theorem 5``, ``issue 32``;
- a level that names an interval or a test's power: ``95 % interval``, ``80 % power``
  (the method's settings, declared once where the tables are explained);
- code: a fenced block, or a code span holding more than a number (a command, a
  parameter, a path, a version: ``--seeds 10``, ``alpha: 0.1``, ``torch 2.13``). A code
  span holding only a number is a figure dressed as code, and counts;
- link targets, URLs and HTML comments.

A sentence ends at ``.``, ``!`` or ``?`` followed by a space and a capital letter, a
bracket or an emphasis mark, or at a blank line, a list item, a table row or a heading.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

GENERATED = re.compile(r"<!-- report:(?P<name>[\w.-]+) -->\n.*?<!-- /report:(?P=name) -->", re.S)
FENCED = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]+`")
HIDDEN = (
    re.compile(r"<!--.*?-->", re.S),  # HTML comments
    re.compile(r"\]\([^)\s]*\)"),  # link targets
    re.compile(r"<?https?://[^\s)>]+>?"),  # URLs
)
CITED = re.compile(r"\[((?:[CP]\d+)(?:,\s+[CP]\d+)*)\]")

NUMBER = re.compile(
    r"(?<![\w.,/-])(?P<sign>[−+-]?)(?P<digits>\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?)"
    r"(?P<magnitude>[kMGB](?![\w]))?(?![\w]|\.\d|,\d{3})"
)
UNIT = re.compile(
    r"\s?(?:%|‰|×(?!\s?\d)|(?:ms|µs|s|min|minutes|seconds|h|hours|KB|kB|MB|GB|TB|MiB|GiB"
    r"|GFLOP/s|GFLOP|images/s|cells/h|steps/s)(?![\w/]))"
)
LEVEL = re.compile(
    r"\s?%\s(?:[\w-]+\s){0,3}?[\w-]*?(?:interval|intervals|bound|bounds|power|chance|confidence"
    r"|level)\b"
)
OUT_OF = re.compile(r"\s?(?:of|/)\s?(?:the\s)?\d")
BESIDE = re.compile(r"[±≈]\s?$")
REFERENCE = re.compile(
    r"(?:Sec\.|Section|Secs\.|Eq\.|Eqs\.|Table|Tables|Figure|Figures|Fig\.|Theorem|Lemma"
    r"|Algorithm|Appendix|Assumption|Criterion|Definition|issue|issues|§)\s?(?:\d[\d.,–-]*\s?(?:and|to|,)\s?)*$"
)


@dataclass(frozen=True)
class Unbacked:
    """A figure that is neither generated nor in a sentence citing a passing claim."""

    path: str
    line: int
    figure: str
    sentence: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.figure!r} is neither generated nor cited ({self.sentence})"


def _blank(match: re.Match[str]) -> str:
    return re.sub(r"[^\n]", " ", match[0])


def prose(text: str) -> str:
    """``text`` with everything that cannot hold an unbacked figure blanked out (same
    length, same lines): generated blocks, code, link targets, URLs and comments. A code
    span holding only a number keeps it."""
    text = GENERATED.sub(_blank, text)
    text = FENCED.sub(_blank, text)
    text = CODE_SPAN.sub(
        lambda m: m[0] if re.fullmatch(r"`[\d.,\s±%×−+-]+`", m[0]) else _blank(m), text
    )
    for pattern in HIDDEN:
        text = pattern.sub(_blank, text)
    return text


STARTS_UNIT = re.compile(r"[ \t]*(?:[-*+]|\d+\.|#+|\|)[ \t]")
ALONE = re.compile(r"[ \t]*(?:#+|\|)")  # a heading or a table row is a unit of one line
CUT = re.compile(r"(?<=[.!?])[*_)\]]*\s+(?=[A-Z(\[*_`])")


def units(text: str) -> Iterator[tuple[int, int]]:
    """The (start, end) offsets of ``text``'s paragraphs, list items, table rows and
    headings."""
    start = None
    offset = 0
    for line in text.splitlines(keepends=True):
        blank = not line.strip()
        if start is not None and (blank or STARTS_UNIT.match(line) or ALONE.match(text, start)):
            yield start, offset
            start = None
        if start is None and not blank:
            start = offset
        offset += len(line)
    if start is not None:
        yield start, offset


def sentences(text: str) -> Iterator[tuple[int, int]]:
    """The (start, end) offsets of the sentences of ``text``: each unit (:func:`units`)
    cut after ``.``, ``!`` or ``?`` where a new sentence starts."""
    for first, last in units(text):
        start = first
        for cut in CUT.finditer(text, first, last):
            yield start, cut.start()
            start = cut.end()
        yield start, last


def is_figure(text: str, match: re.Match[str]) -> bool:
    """Whether the number ``match`` in ``text`` states a result (module docstring)."""
    before, after = text[: match.start()], text[match.end() :]
    if REFERENCE.search(before[-40:]):
        return False
    if LEVEL.match(after):
        return False
    return bool(
        re.search(r"[.e]", match["digits"])
        or UNIT.match(after)
        or OUT_OF.match(after)
        or re.search(r"\d\s?(?:of|/)\s?(?:the\s)?$", before[-12:])
        or BESIDE.search(before[-3:])
    )


def figures(text: str) -> list[tuple[int, str]]:
    """The figures of ``text`` (prose already): their offsets and how they read. A count
    out of a total is one figure (``3 of 10``)."""
    found: list[tuple[int, str]] = []
    covered = 0
    for match in NUMBER.finditer(text):
        if match.start() < covered or not is_figure(text, match):
            continue
        end = match.end()
        total = OUT_OF.match(text, end)
        if total:
            end = total.end() + len(re.match(r"[\d,]*", text[total.end() :])[0])
        unit = UNIT.match(text, end)
        end = unit.end() if unit else end
        found.append((match.start(), text[match.start() : end]))
        covered = end
    return found


def unbacked(text: str, path: str, passing: set[str]) -> list[Unbacked]:
    """Every figure of ``text`` (the document at ``path``) outside a generated block whose
    sentence cites no claim, or cites one not in ``passing`` (the ids whose check passes)."""
    masked = prose(text)
    found = []
    for start, end in sentences(masked):
        sentence = masked[start:end]
        cited = {i for group in CITED.findall(text[start:end]) for i in re.split(r",\s+", group)}
        if cited and cited <= passing:
            continue
        for offset, figure in figures(sentence):
            line = masked.count("\n", 0, start + offset) + 1
            shown = " ".join(text[start:end].split())
            found.append(Unbacked(path, line, figure, shown[:90] + "…" * (len(shown) > 90)))
    return found
