"""The card of a registered model version (after Google's Model Card Toolkit): what it
is, what each site trained on, how it was aggregated and who was left out, how it scores
and is calibrated, its privacy, and where it came from. Written as ``card.json`` and
``card.md`` beside the model, and as the version's description, which the MLflow UI
shows with the version. No image is in it: a site is its name, counts and digest."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path
from typing import Any

from config.params import Params
from federated.data import DatasetInfo
from tasks.reports import ProjectPaths

__all__ = ["build_card", "card_markdown"]


def build_card(
    params: Params,
    paths: ProjectPaths,
    results: dict[str, Any],
    run: dict[str, Any],
    info: DatasetInfo,
) -> dict[str, Any]:
    """The card's fields from the run's reports and params (``run``: the model's name,
    version, run id, tags, the gate's decisions and the plan's digest)."""
    names = _site_names(params, paths)
    return {
        "model": {
            "name": run["name"], "version": run["version"], "run_id": run["run_id"],
            "architecture": params.model.name, "task": info.task, "classes": list(info.labels),
            "input": _input_text(info),
        },
        "intended_use": params.tracking.intended_use,
        "limitations": params.tracking.limitations,
        "data": {"dataset": params.data.dataset, "sites": _sites(params, paths, info)},
        "training": {
            "rule": params.aggregate.name,
            "filters": [f.name for f in params.filters] or ["none"],
            "rounds": results.get("rounds"), "selected_round": results.get("selected_round"),
            "exclusions": _exclusions(paths.exclusions, run["tags"].get("exclusions")),
        },
        "performance": {
            "test": {k[5:]: v for k, v in results.items() if k.startswith("test_")},
            "sites": _site_spread(results, names),
            "per_site": _per_site(paths, names),
            "gate": run.get("gate", {}),
        },
        "privacy": {"mode": params.privacy.mode, "epsilon": results.get("privacy_epsilon"),
                    "delta": results.get("privacy_delta")},
        "provenance": {
            "plan_sha256": run.get("plan_sha256", ""),
            "code_commit": run["tags"].get("git_commit", "unknown"),
            "params_hash": run["tags"].get("params_hash", ""),
        },
    }  # fmt: skip


def _input_text(info: DatasetInfo) -> str:
    if info.is_volume:
        size = "x".join([str(info.size)] * 3)
        return (
            f"a volume: a NIfTI file, a multi-frame DICOM or a folder holding one DICOM series "
            f"(slices ordered along the slice normal), read as grey at {size} voxels "
            f"(spacing {info.spacing}, torch trilinear; intensity {info.intensity})"
        )
    colour = "grey" if info.n_channels == 1 else "RGB"
    return (
        f"PNG, JPEG, BMP, TIFF or DICOM files, read as {colour} at {info.size}x{info.size} px "
        f"(intensity {info.intensity}, resample {info.resample})"
    )


def _sites(params: Params, paths: ProjectPaths, info: DatasetInfo) -> list[dict[str, Any]]:
    """Each site (simulated client or real site): its name, training samples, counts per
    class where the hub knows them, and its data's digest where recorded."""
    if params.federation.runtime == "flower":  # what each site registered, and said
        said = {}
        if paths.site_data.exists():
            said = {row["site"]: row for row in json.loads(paths.site_data.read_text())["sites"]}
        rows = []
        for site in params.federation.sites:
            row: dict[str, Any] = {"site": site.name, "samples": site.samples}
            if site.name in said:
                row |= {"classes": said[site.name]["classes"], "sha256": said[site.name]["sha256"]}
                if said[site.name]["changed"]:
                    row["changed"] = [seen["sha256"] for seen in said[site.name]["history"]]
            rows.append(row)
        return rows
    if not paths.partition_report.exists():
        return []
    report = json.loads(paths.partition_report.read_text())
    rows = []
    for client in report.get("clients", []):
        row: dict[str, Any] = {
            "site": client.get("name", f"client {client['client']}"),
            "samples": client.get("size", client.get("samples")),
        }
        if "classes" in client:
            row["classes"] = dict(zip(info.labels, client["classes"], strict=False))
        if client.get("sha256") or report.get("data_sha256"):
            row["sha256"] = client.get("sha256") or report["data_sha256"]
        rows.append(row)
    return rows


def _site_names(params: Params, paths: ProjectPaths) -> dict[int, str]:
    """Each site's name by its id in the run's reports: a real site's from the plan, a
    simulated client's from the partition report (``client N`` where it names none)."""
    if params.federation.runtime == "flower":
        return {number: site.name for number, site in enumerate(params.federation.sites)}
    if not paths.partition_report.exists():
        return {}
    clients = json.loads(paths.partition_report.read_text()).get("clients", [])
    return {
        int(c["client"]): c.get("name", f"client {c['client']}") for c in clients if "client" in c
    }


def _site_name(number: Any, names: dict[int, str]) -> str:
    return names.get(int(number), f"client {int(number)}")


def _site_spread(results: dict[str, Any], names: dict[int, str]) -> dict[str, Any]:
    """The spread of the final model over the sites' held-out splits, the worst and best
    site by name (the reports give their ids)."""
    spread = {k: v for k, v in results.items() if k.startswith(("site_", "sites_"))}
    for which in ("site_worst", "site_best"):
        if which in spread:
            spread[which] = _site_name(spread[which], names)
    return spread


def _per_site(paths: ProjectPaths, names: dict[int, str]) -> list[dict[str, Any]]:
    """The final model on each site's held-out split: the site's name, how many held-out
    images it scored, and its accuracy and AUC (``reports/sites.json``)."""
    if not paths.sites_final.exists():
        return []
    rows = json.loads(paths.sites_final.read_text()).get("sites", [])
    return [
        {"site": _site_name(row["site"], names), "held_out": int(row["n"]),
         **{k: row[k] for k in ("acc", "auc") if k in row}}
        for row in rows
    ]  # fmt: skip


def _exclusions(trail: Path, measured: str | None) -> dict[str, Any]:
    """How many client-rounds the filters left out, of how many, by reason, and which
    clients were ever left out (the trail, ``reports/exclusions.csv``); with none left
    out, what this defence caught where it was measured (``measured``: what the train
    stage said, its run's tag ``exclusions``: tasks/measured_defence.py)."""
    rows = []
    if trail.exists():
        with trail.open() as handle:
            rows = list(csv.DictReader(handle))
    excluded = [r for r in rows if r.get("excluded") == "True"]
    found: dict[str, Any] = {
        "client_rounds": len(rows),
        "excluded": len(excluded),
        "by_reason": dict(Counter(r.get("reason") or "unstated" for r in excluded)),
        "clients_ever_excluded": sorted({int(r["client"]) for r in excluded}),
        "contribution": _contributions(rows),
    }
    if not excluded and measured:
        found["measured"] = measured
    return found


def _contributions(rows: list[dict[str, str]]) -> dict[str, dict[str, float]]:
    """Each site's mean contribution over the rounds validation at the sites measured it
    (the others' held-out loss without it minus with it), and how many rounds: by name."""
    measured: dict[str, list[float]] = {}
    for row in rows:
        value = row.get("contribution", "")
        if value not in ("", "nan"):
            name = row.get("site") or f"client {row['client']}"
            measured.setdefault(name, []).append(float(value))
    return {
        name: {"mean": sum(values) / len(values), "rounds": len(values)}
        for name, values in measured.items()
    }


def card_markdown(card: dict[str, Any]) -> str:
    """The card as markdown, for people (and the registry's version page)."""
    model, data, training = card["model"], card["data"], card["training"]
    lines = [
        f"# {model['name']} version {model['version']}",
        "",
        f"A {model['architecture']} for a {model['task']} task: {', '.join(model['classes'])}.",
        f"Input: {model['input']}. Output: one probability per class and the predicted class.",
        "",
        f"**Intended use.** {card['intended_use']}",
        "",
        f"**Limitations.** {card['limitations']}",
        "",
        f"## Data: {data['dataset']}, {len(data['sites'])} sites",
        "",
        "| site | samples | per class | data SHA-256 |",
        "|---|---|---|---|",
    ]
    for site in data["sites"]:
        classes = ", ".join(f"{k}: {v}" for k, v in site.get("classes", {}).items()) or "-"
        digest = site.get("sha256", "-")[:16]
        if "changed" in site:  # it changed during the run: each digest, in order
            digest = " then ".join(sha[:16] for sha in site["changed"]) + " (changed mid-run)"
        lines.append(f"| {site['site']} | {site['samples']} | {classes} | {digest} |")
    exclusions = training["exclusions"]
    lines += [
        "",
        f"## Training: {training['rule']}, filters {', '.join(training['filters'])}",
        "",
        f"{training['rounds']} rounds (round {training['selected_round']} selected); "
        f"{exclusions['excluded']} of {exclusions['client_rounds']} client-rounds excluded"
        + (f" ({_counts(exclusions['by_reason'])})" if exclusions.get("by_reason") else "")
        + ".",
        *(["", _sentence(exclusions["measured"])] if "measured" in exclusions else []),
        *_contribution_lines(exclusions.get("contribution", {})),
        "",
        "## Performance on held-out data",
        "",
        *(f"- {k}: {_value(v)}" for k, v in card["performance"]["test"].items()),
        *(f"- {k}: {_value(v)}" for k, v in card["performance"]["sites"].items()),
        *_per_site_lines(card["performance"]["per_site"]),
        *(f"- gate, {k}: {v}" for k, v in card["performance"]["gate"].items()),
        "",
        f"## Privacy: {card['privacy']['mode']}"
        + (
            f", ε {card['privacy']['epsilon']:.3f} at δ {card['privacy']['delta']:g}"
            if card["privacy"]["epsilon"] is not None
            else ""
        ),
        "",
        "## Provenance",
        "",
        f"- plan SHA-256: {card['provenance']['plan_sha256'] or '-'}",
        f"- code commit: {card['provenance']['code_commit']}",
        f"- params hash: {card['provenance']['params_hash']}",
        f"- MLflow run: {model['run_id']}",
    ]
    return "\n".join(lines) + "\n"


def _sentence(text: str) -> str:
    return f"{text[0].upper()}{text[1:]}."


def _per_site_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The per-site table of the final model on each site's held-out split."""
    if not rows:
        return []
    lines = ["", "| site | held-out images | accuracy | AUC |", "|---|---|---|---|"]
    for row in rows:
        scores = " | ".join(_value(row[k]) if k in row else "-" for k in ("acc", "auc"))
        lines.append(f"| {row['site']} | {row['held_out']} | {scores} |")
    return lines


def _contribution_lines(contribution: dict[str, dict[str, float]]) -> list[str]:
    """Validation at the sites: each site's mean contribution (none without it)."""
    if not contribution:
        return []
    return [
        "",
        "Contribution per site (validation at the sites: the other sites' held-out loss "
        "without it minus with it, the mean over the rounds it was measured; positive "
        "helps the others):",
        "",
        *(
            f"- {name}: {c['mean']:+.4f} over {c['rounds']:.0f} rounds"
            for name, c in contribution.items()
        ),
    ]


def _counts(by_reason: dict[str, int]) -> str:
    return ", ".join(f"{reason}: {count}" for reason, count in by_reason.items())


def _value(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)
