"""What a run's defence caught where it was measured, said by the run itself.

A consortium that reads its trail should know what the configured filters can catch at
its size: at three sites a distance score may exclude nobody, and "no site excluded"
then says little. The small consortium's benchmark (benchmarks/robustness/small_consortium.py)
records, per dataset, size, attack and defence, in how many of its seeds the one
attacking site was out, one record per model it was measured with (:data:`RECORDS`: the
logistic model, and params.yaml's small CNN); the record of the run's own model is read
here (the files only: the pipeline does not import the benchmarks). What a filter catches
depends on the model it guards (on BreastMNIST at three sites validation at the sites
caught the flipper far more often with the small CNN than with the logistic model), so a
run of a model no record measured is told so, never given another model's rows. A run's
filters are matched to a measured defence by building both and comparing every setting,
so a filter with one setting changed is "not measured", never borrowed from a
neighbour's row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggregation.registry import build_filter
from config.params import Params, population
from federated.seeding import clients_per_round
from registry import RegistryError

__all__ = [
    "RECORD", "RECORDS", "Measured", "measured_for", "no_exclusion_sentence", "record_path",
    "start_line",
]  # fmt: skip

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks/results"
# model -> the small consortium's record measured with it (its family's ``stem``-cpu.json)
RECORDS = {
    "logreg": RESULTS / "small-consortium-cpu.json",
    "small_cnn": RESULTS / "small-consortium-cnn-cpu.json",
}
RECORD = RECORDS["logreg"]
SHOWN = "benchmarks/results/small-consortium-cpu.json"
ATTACKS = {"label_flip": "a label flipper", "sign_flip": "a sign flipper", "alie": "ALIE",
           "backdoor": "a backdoor"}  # fmt: skip


@dataclass(frozen=True)
class Measured:
    """The record's rows for a run: ``defence`` (the record's name for the run's filters,
    None where no measured defence has them), the measured size nearest to the run's
    ``run_sites`` (``sites``), those rows, and what the record measured."""

    run_sites: int
    defence: str | None = None
    sites: int | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    known: list[str] = field(default_factory=list)
    rounds: int | None = None
    model: str | None = None
    rule: str = "median"
    recommended: dict[str, Any] | None = None  # the record's choice at ``sites``


def record_path(params: Params) -> Path | None:
    """The record measured with the run's model, or None where no record measures it."""
    return RECORDS.get(params.model.name)


def shown(path: Path) -> str:
    """A record's path as the lines name it (from the repository root)."""
    return f"benchmarks/results/{path.name}"


def load_record(path: Path = RECORD) -> dict[str, Any] | None:
    """The committed record, or None where this checkout has none (or an older layout
    without its defences' settings)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if "rows" not in record or "defences" not in record.get("settings", {}):
        return None
    return record


def _built(specs: list[dict[str, Any]]) -> list[Any] | None:
    """The filters ``specs`` name, built with every setting, or None where this checkout
    cannot build one (a filter it does not have)."""
    try:
        return [build_filter(s["name"], **{k: v for k, v in s.items() if k != "name"})
                for s in specs]  # fmt: skip
    except (RegistryError, TypeError, ValueError):
        return None


def run_sites(params: Params) -> int:
    """The sites a round scores: what a filter sees."""
    return clients_per_round(params.train.client_fraction, population(params))


def measured_for(params: Params, record: dict[str, Any] | None) -> Measured:
    """The record's rows for the run's filters at the measured size nearest to its own
    (ties: the smaller size)."""
    sites = run_sites(params)
    if record is None:
        return Measured(sites)
    model = record["settings"].get("model")
    if model != params.model.name:  # another model's rows say nothing of this run's
        return Measured(sites, model=model)
    defences: dict[str, list[dict[str, Any]]] = record["settings"]["defences"]
    known = [name for name in defences if any(r["defence"] == name for r in record["rows"])]
    rule, rounds = record["settings"].get("rule", "median"), record["settings"].get("rounds")
    if not in_front_of(params, rule):  # filters measured in front of another rule
        return Measured(sites, known=known, rounds=rounds, model=model, rule=rule)
    mine = [build_filter(f.name, **f.params()) for f in params.filters]
    defence = next((name for name in known if _built(defences[name]) == mine), None)
    if defence is None:
        return Measured(sites, known=known, rounds=rounds, model=model, rule=rule)
    rows = [r for r in record["rows"] if r["defence"] == defence]
    nearest = min({r["sites"] for r in rows}, key=lambda s: (abs(s - sites), s))
    return Measured(
        sites, defence, nearest, [r for r in rows if r["sites"] == nearest], known,
        rounds, model, rule, record.get("recommended", {}).get(str(nearest)),
    )  # fmt: skip


def in_front_of(params: Params, rule: str) -> bool:
    """Whether the run's filters stand where the record measured them: directly in front
    of ``rule`` (no pre-aggregator between)."""
    return params.aggregate.name == rule and not params.preaggregators


def _other_rule(params: Params, measured: Measured, path: Path) -> str:
    """A run whose filters stand in front of another rule than the record's."""
    between = ", ".join(p.name for p in params.preaggregators)
    used = params.aggregate.name + (f" after {between}" if between else "")
    return (
        f"not measured in front of {used} ({shown(path)} measures filters directly in front "
        f"of {measured.rule} with {measured.model})"
    )


def _where(measured: Measured) -> str:
    nearest = "" if measured.sites == measured.run_sites else (
        f" (the measured size nearest to this run's {measured.run_sites})"
    )  # fmt: skip
    return f"{measured.sites} sites{nearest}"


def _caught(rows: list[dict[str, Any]]) -> str:
    """``2 of 10 seeds on breastmnist, 10 of 10 on digits``."""
    parts = [f"{r['caught_seeds']} of {r['seeds']}" + (" seeds" if i == 0 else "")
             + f" on {r['dataset']}" for i, r in enumerate(rows)]  # fmt: skip
    return ", ".join(parts)


def _name(measured: Measured) -> str:
    if measured.defence == "median":
        return "no filter (measured: the median alone)"
    return f"{measured.defence} (measured in front of the median)"


def _other_model(params: Params) -> str:
    """Which models the records measure, for a run of a model none of them measured."""
    measured = ", ".join(f"{model} ({shown(path)})" for model, path in RECORDS.items())
    return f"not measured with this run's model, {params.model.name} (measured with {measured})"


def _record_for(params: Params, path: Path | None) -> tuple[Path | None, dict[str, Any] | None]:
    """The record to read for the run (``path``, or its model's) and its content."""
    path = path if path is not None else record_path(params)
    return path, (load_record(path) if path is not None else None)


def start_line(params: Params, path: Path | None = None) -> str:
    """One line for the run's start: what its filters caught with the run's model at the
    measured size nearest to its own, per attack and dataset, or that they were not
    measured (with this model, or at all). ``path``: the record to read (default: the
    run's model's, :data:`RECORDS`)."""
    path, record = _record_for(params, path)
    if path is None:
        return f"defence as measured: {_other_model(params)}; what its filters catch is unknown"
    if record is None:
        return (
            f"defence as measured: no record of what filters catch with {params.model.name} "
            f"({shown(path)} not found, or written before its rows)"
        )
    measured = measured_for(params, record)
    if measured.model != params.model.name:
        return f"defence as measured: {_other_model(params)}; what its filters catch is unknown"
    if not in_front_of(params, measured.rule):
        return (
            f"defence as measured: this run's defence was {_other_rule(params, measured, path)};"
            f" what it catches at {measured.run_sites} sites is unknown"
        )
    if measured.defence is None:
        names = ", ".join(f.name for f in params.filters)
        return (
            f"defence as measured: the configured filters ({names}, as set) were not measured "
            f"({shown(path)} measures {', '.join(measured.known)} with {measured.model}); "
            f"what they catch at {measured.run_sites} sites is unknown"
        )
    attacks = [a for a in ATTACKS if any(r["attack"] == a for r in measured.rows)]
    caught = "; ".join(
        f"{ATTACKS[a]} out in {_caught([r for r in measured.rows if r['attack'] == a])}"
        for a in attacks
    )
    return (
        f"defence as measured: {_name(measured)} with {measured.model} at {_where(measured)}, "
        f"one attacking site, {measured.rounds} rounds ({shown(path)}): {caught}"
        f"{_recommendation(measured)}"
    )


def _recommendation(measured: Measured) -> str:
    """Where the record's choice at the measured size holds (this defence or another)."""
    choice = measured.recommended
    if not choice:
        return ""
    at = f"for {measured.model} at {measured.sites} sites"
    if choice["defence"] != measured.defence:
        return f"; the recommendation {at} is {choice['defence']}"
    holds = ", ".join(choice.get("holds_on", [])) or "no dataset"
    fails = ", ".join(choice.get("fails_on", []))
    if not fails:
        return f"; the recommendation {at}: it holds against a label flipper on every dataset measured ({holds})"
    return (
        f"; the recommendation {at}: it holds against a label flipper on {holds}, and does "
        f"not on {fails}"
    )


def no_exclusion_sentence(params: Params, path: Path | None = None) -> str:
    """What the trail and the card say when no site was excluded: how many label flippers
    this defence caught with the run's model at the measured size nearest to the run's (on
    the run's dataset where it was measured, else on each measured dataset)."""
    path, record = _record_for(params, path)
    measured = measured_for(params, record)
    if path is None or (record is not None and measured.model != params.model.name):
        return f"no site excluded; this defence was {_other_model(params)}"
    if record is not None and not in_front_of(params, measured.rule):
        return f"no site excluded; this defence was {_other_rule(params, measured, path)}"
    flippers = [r for r in measured.rows if r["attack"] == "label_flip"]
    if not flippers:
        return (
            "no site excluded; this defence was not measured against a label flipper with "
            f"{params.model.name} in our measurements ({shown(path)})"
        )
    own = [r for r in flippers if r["dataset"] == params.data.dataset]
    model = measured.model
    if own:
        row = own[0]
        return (
            f"no site excluded; this defence caught {row['caught_seeds']} of {row['seeds']} "
            f"label flippers at {_where(measured)} in our measurements ({row['dataset']}, "
            f"{model})"
        )
    each = ", ".join(f"{r['caught_seeds']} of {r['seeds']} ({r['dataset']})" for r in flippers)
    return (
        f"no site excluded; this defence caught {each} label flippers at {_where(measured)} "
        f"in our measurements ({model})"
    )
