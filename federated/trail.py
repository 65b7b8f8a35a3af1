"""The exclusion trail: one row per sampled client and round, saying whether its update
reached the rule and, if not, why (the reasons are listed in :mod:`federated.server`).
These functions read and write rows; they decide nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from torch import Tensor

from aggregation.defence import FilterStep
from federated.client import ClientData, ClientUpdate, LocalTraining, RegisteredClient, local_steps
from federated.execution import ClientResult

__all__ = [
    "TrailRows",
    "checked_update",
    "contributions",
    "detection_counts",
    "failed_to_answer",
    "is_left_out",
    "left_out",
    "new_row",
    "record_decisions",
    "record_filter_steps",
    "record_local_work",
    "sent_update",
    "worst_client",
]

TrailRows = dict[int, dict[str, Any]]  # a round's trail rows by client id


def record_filter_steps(steps: Sequence[FilterStep], ids: Sequence[int], rows: TrailRows) -> None:
    """Each filter's scores, threshold and columns into the rows of the clients it judged,
    and its exclusions with their reason."""
    for step in steps:
        decision = step.decision
        for row_index, position in enumerate(step.positions.tolist()):
            row = rows[ids[position]]
            if decision.scores is not None:
                row["score"] = float(decision.scores[row_index])
            if decision.threshold is not None:
                row["threshold"] = float(decision.threshold)
            for name, column in decision.columns.items():
                row[name] = float(column[row_index])
            if not bool(decision.keep[row_index]):
                row.update(excluded=True, reason=decision.reason, message=decision.note)


def record_decisions(columns: dict[str, Tensor], kept_ids: Sequence[int], rows: TrailRows) -> None:
    """Per-client values of the pre-aggregators and the rule into the trail; a selecting
    rule's choice (Krum, Multi-Krum, Bulyan) as ``selected``."""
    for name, values in columns.items():
        for client_id, value in zip(kept_ids, values.tolist(), strict=True):
            if name == "selected":
                rows[client_id]["selected"] = bool(value)
            elif value == value:  # NaN: the value does not apply to this client
                rows[client_id][name] = float(value)


def contributions(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each client's contribution this round as validation at the sites measured it (the
    others' held-out loss without it minus with it), as ``contribution_<client>``."""
    return {
        f"contribution_{row['client']}": float(row["contribution"])
        for row in rows
        if "contribution" in row and row["contribution"] == row["contribution"]
    }


def failed_to_answer(row: dict[str, Any]) -> bool:
    """A trail row of a client that sent no update (``client_error``, ``client_timeout``,
    ``client_unavailable``): a failure, not a detection."""
    return str(row["reason"]).startswith("client_")


def sent_update(row: dict[str, Any]) -> bool:
    """A trail row of a client whose update reached the server (kept or not)."""
    return not failed_to_answer(row) and row["reason"] != "noniid_loss"


def is_left_out(row: dict[str, Any]) -> bool:
    """Excluded by a check, screen or filter, or not chosen by a selecting rule."""
    return bool(row["excluded"] or row.get("selected") is False)


def left_out(rows: Sequence[dict[str, Any]]) -> int:
    """How many of a round's clients the defence left out (failures to answer aside)."""
    return sum(is_left_out(r) for r in rows if not failed_to_answer(r))


def detection_counts(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Exclusions against the ground truth: a false positive is an honest client left out,
    a false negative a malicious client kept. Left out means excluded by a screen or filter,
    or not chosen by a selecting rule (Krum, Multi-Krum, Bulyan record ``selected``): such
    a rule's choice is its detection. Client errors are not detections."""
    judged = [r for r in rows if not failed_to_answer(r)]
    left_out = [is_left_out(r) for r in judged]
    malicious = [bool(r["malicious"]) for r in judged]
    tp = sum(out and bad for out, bad in zip(left_out, malicious, strict=True))
    fp = sum(out and not bad for out, bad in zip(left_out, malicious, strict=True))
    fn = sum(not out and bad for out, bad in zip(left_out, malicious, strict=True))
    counts = {
        "true_positives": float(tp),
        "false_positives": float(fp),
        "false_negatives": float(fn),
    }
    if tp + fp:  # undefined (left out) when nobody was excluded
        counts["precision"] = tp / (tp + fp)
    if tp + fn:  # undefined when nobody is malicious
        counts["recall"] = tp / (tp + fn)
    return counts


def new_row(
    round_number: int, client: ClientData | RegisteredClient, *, malicious: bool
) -> dict[str, Any]:
    """A sampled client's row before anything is decided about it."""
    site = {"site": client.name} if isinstance(client, RegisteredClient) else {}
    return {
        "round": round_number,
        "client": client.client_id,
        **site,  # a real site's name (whom the hub's operator calls)
        "num_samples": len(client),
        "malicious": malicious,
        "excluded": False,
        "reason": "",
        "message": "",
    }


def checked_update(
    result: ClientResult, row: dict[str, Any], global_vector: Tensor
) -> ClientUpdate | None:
    """The result's update if one came and it fits the model; otherwise ``None`` and
    the row marked with why: ``client_<outcome>`` (``client_error``, ...) or
    ``bad_update`` (a wrong shape or dtype, of the update or SCAFFOLD's control delta)."""
    update = result.update
    if result.outcome != "ok" or update is None:
        row.update(excluded=True, reason=f"client_{result.outcome}", message=result.message)
        return None
    for what, vector in (("update", update.delta), ("control delta", update.control_delta)):
        if vector is None or (vector.shape == global_vector.shape and vector.is_floating_point()):
            continue
        row.update(
            excluded=True, reason="bad_update",
            message=f"{what} of shape {tuple(vector.shape)} and dtype {vector.dtype}; "
            f"the model has {tuple(global_vector.shape)} parameters",
        )  # fmt: skip
        return None
    row["train_loss"] = update.train_loss
    if update.num_samples != row["num_samples"]:  # weighted by the registered count
        row["reported_samples"] = update.num_samples
        row["message"] = (
            f"reported {update.num_samples} training samples, {row['num_samples']} "
            "registered: weighted by the registered count"
        )
        update = replace(update, num_samples=row["num_samples"])
    return update


def record_local_work(
    row: dict[str, Any], update: ClientUpdate, local: LocalTraining, epochs: int
) -> None:
    """The client's local epochs and SGD steps in the round (FedNova's τ_i) into its row."""
    row["local_epochs"] = epochs
    row["local_steps"] = local_steps(update.num_samples, local.batch_size, epochs)


def worst_client(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The round's worst client by its loss of the global model (``model_loss``, where
    the round measured it: AFL): that loss and the client's id; empty otherwise."""
    measured = [row for row in rows if "model_loss" in row]
    if not measured:
        return {}
    worst = max(measured, key=lambda row: row["model_loss"])
    return {"worst_client_loss": float(worst["model_loss"]), "worst_client": float(worst["client"])}
