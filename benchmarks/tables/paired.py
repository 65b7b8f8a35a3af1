"""A paired table: methods against one reference, seed by seed, Holm-adjusted, with the
smallest difference each test could detect. The claims ledger reads its verdicts from the
same adjustment the table shows."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from benchmarks.tables.cells import shown
from tasks.comparison import interval


@dataclass(frozen=True)
class Paired:
    """Methods against one reference, seed by seed: per test (method, ``label``'s value,
    (per-seed differences, sign-flip p)). Holm adjusts over the table, or over each
    value's tests where ``family_per_value`` (separate regimes, separate questions); the
    claims ledger reads its verdicts from the same adjustment the table shows."""

    tests: list[tuple[str, str, tuple[Any, float]]]
    reference: str
    label: str
    statistic: str = "worst case"
    family_per_value: bool = False

    def families(self) -> list[list[int]]:
        """The tests' indices, one list per family Holm adjusts over."""
        families: dict[str, list[int]] = {}
        for index, (_, value, _) in enumerate(self.tests):
            families.setdefault(value if self.family_per_value else "", []).append(index)
        return list(families.values())

    def index_of(self, method: str, value: str) -> int | None:
        """The index of ``method``'s test at ``value``, or None where the table has none."""
        for index, (tested, tested_value, _) in enumerate(self.tests):
            if (tested, tested_value) == (method, value):
                return index
        return None

    def family_size(self, index: int) -> int:
        """How many tests Holm adjusts test ``index`` with."""
        return next(len(family) for family in self.families() if index in family)

    def holm(self) -> list[float]:
        """Each test's p, Holm-adjusted within its family (statsmodels)."""
        return list(self._holm)

    @cached_property
    def _holm(self) -> tuple[float, ...]:
        """Adjusted once per table: statsmodels' Holm runs a full garbage collection on
        every call, a second or more in a process holding the records."""
        from statsmodels.stats.multitest import multipletests

        adjusted = [1.0] * len(self.tests)
        for members in self.families():
            holm = multipletests([self.tests[i][2][1] for i in members], method="holm")[1]
            for i, p_holm in zip(members, holm, strict=True):
                adjusted[i] = float(p_holm)
        return tuple(adjusted)


def against_block(paired: Paired) -> str:
    """A paired table: per test the mean difference ± t-interval, the exact p, Holm's
    adjustment (:meth:`Paired.holm`), and, where the adjusted p is not below 0.05, the
    smallest difference the test had an 80 % chance to detect (statsmodels' one-sample
    t power, from the differences' spread)."""
    from statsmodels.stats.power import TTestPower

    lines = [
        f"| method | {paired.label} | {paired.statistic} minus {paired.reference}'s "
        "| p (sign-flip over seeds) | p, Holm | smallest detectable difference (80 % power) |",
        "|---|---|---|---|---|---|",
    ]
    for (method, value, (differences, p)), p_holm in zip(paired.tests, paired.holm(), strict=True):
        _, std, _ = interval(list(differences))
        if p_holm < 0.05:
            detectable = "–"
        elif not std > 0:
            detectable = "none: equal in every seed"
        else:
            d = TTestPower().solve_power(nobs=len(differences), alpha=0.05, power=0.8)
            detectable = f"{d * std:.2f}"
        lines.append(
            f"| {method} | {value} | {shown(differences, 3)} | {p:.3g} | {p_holm:.3g} "
            f"| {detectable} |"
        )
    return "\n".join(lines) + "\n"
