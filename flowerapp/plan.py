"""The training plan a site approves, and the check its ClientApp makes on every task.

A task tells a site which model to build, on which data shape, and how to train and score
it (:class:`flowerapp.task.SiteTask`). Those settings are the plan: the hub writes it with
``fedsieve plan``, the site's operator reads it, and ``fedsieve-site --plan plan.json``
pins it. From then on a task whose plan differs in any setting (another model, a higher
learning rate, more epochs) is refused in one logged line naming what differs, as
Fed-BioMed's training-plan approval does. The record's per-message fields (round, client
id, batch-order seed) are not part of the plan.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "PlanError",
    "plan_differences",
    "plan_digest",
    "read_plan",
    "training_plan",
    "write_plan",
]

from flowerapp.task import SiteTask

PER_MESSAGE = SiteTask.per_message_fields()
Plan = SiteTask | Mapping[str, Any]  # a task, or a plan as read from its JSON file


class PlanError(ValueError):
    """A plan file that cannot be read: the reason, in one line."""


def training_plan(task: Plan) -> dict[str, Any]:
    """The settings of ``task`` a site approves (all but the per-message fields)."""
    if isinstance(task, SiteTask):
        return task.plan()
    return {key: task[key] for key in sorted(task) if key not in PER_MESSAGE}


def plan_digest(plan: Plan) -> str:
    """SHA-256 of the plan's canonical JSON: a short name for it in logs and messages."""
    canonical = json.dumps(training_plan(plan), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def write_plan(path: Path, plan: Plan) -> str:
    """Write the plan for the sites' operators to read and pin; its digest."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(training_plan(plan), indent=1, sort_keys=True) + "\n")
    return plan_digest(plan)


def read_plan(path: str | Path) -> dict[str, Any]:
    """A plan file, or :class:`PlanError` saying what is wrong with it."""
    try:
        plan = json.loads(Path(path).read_text())
    except OSError as error:
        raise PlanError(f"plan {path}: {error.strerror or error}") from None
    except json.JSONDecodeError as error:
        raise PlanError(f"plan {path}: not JSON ({error.msg}, line {error.lineno})") from None
    if not isinstance(plan, dict) or not plan:
        raise PlanError(
            f"plan {path}: must be a JSON object of settings (fedsieve plan writes one)"
        )
    return training_plan(plan)


def plan_differences(approved: Plan, task: Plan) -> list[str]:
    """Each setting where ``task`` departs from the approved plan, as ``key=asked
    (approved value)``; empty when the task runs the approved plan."""
    asked, approved = training_plan(task), training_plan(approved)
    return [
        f"{key}={asked.get(key, '<missing>')} (approved {approved.get(key, '<none>')})"
        for key in sorted(set(approved) | set(asked))
        if asked.get(key) != approved.get(key)
    ]
