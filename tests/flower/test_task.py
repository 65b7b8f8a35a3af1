"""The task a site receives is one typed record: what the hub sends is what the site reads,
and a task that does not follow the schema is refused in one line, never cast."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from config.params import Params
from federated.data import dataset_info
from flowerapp.hub import site_task
from flowerapp.plan import plan_differences, training_plan
from flowerapp.task import VOLUME_FIELDS, SiteTask, TaskError

TASK = site_task(
    Params.model_validate({"data": {"dataset": "digits"}, "model": {"name": "logreg"}}),
    dataset_info("digits"),
)


def sent(**changes: Any) -> dict[str, Any]:
    """The record a hub sends for round 2 to client 1, with ``changes`` made to it."""
    return replace(TASK, round=2, client=1, shuffle_seed=99).to_config() | changes


def test_the_site_reads_the_task_the_hub_sent() -> None:
    task = SiteTask.from_config(sent())

    assert task == replace(TASK, round=2, client=1, shuffle_seed=99)
    assert isinstance(task.lr, float) and isinstance(task.multi_label, bool)
    assert task.local_training().lr == TASK.lr and task.dataset_info().n_classes == 10


def test_the_plan_is_the_record_without_its_per_message_fields() -> None:
    plan = training_plan(TASK)

    per_message = {"round", "client", "shuffle_seed", "run_key"}
    # scaffold: false and an image task's volume settings are left out, so plans approved
    # before SCAFFOLD and volumes at the sites still hold
    left_out = per_message | {"scaffold", *VOLUME_FIELDS}
    assert set(plan) == {f for f in TASK.to_config() if f not in left_out}
    assert plan_differences(plan, SiteTask.from_config(sent(run_key="ab12cd34ef56"))) == []
    assert SiteTask.per_message_fields() == per_message


def test_a_plan_without_scaffold_refuses_a_scaffold_task_and_one_with_it_approves_it() -> None:
    scaffold = replace(TASK, scaffold=True)

    assert training_plan(scaffold)["scaffold"] is True
    assert plan_differences(training_plan(TASK), scaffold) == ["scaffold=True (approved <none>)"]
    assert (
        plan_differences(training_plan(scaffold), SiteTask.from_config(sent(scaffold=True))) == []
    )


def test_a_whole_number_where_a_float_is_due_is_that_float() -> None:
    assert SiteTask.from_config(sent(lr=1)).lr == 1.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"lr": "0.05"}, "task setting lr = '0.05' is str, not float"),
        ({"epochs": 2.0}, "task setting epochs = 2.0 is float, not int"),
        ({"epochs": True}, "task setting epochs = True is bool, not int"),
        ({"multi_label": 0}, "task setting multi_label = 0 is int, not bool"),
        ({"noise": 1.0}, "the task has setting(s) this site does not know: noise"),
    ],
)
def test_a_malformed_task_is_refused_in_one_line(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(TaskError) as error:
        SiteTask.from_config(sent(**changes))

    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_a_task_lacking_a_setting_is_refused() -> None:
    record = sent()
    del record["batch_size"]

    with pytest.raises(TaskError, match=r"^the task lacks the setting batch_size$"):
        SiteTask.from_config(record)


def test_a_volume_task_carries_how_its_volumes_are_read_in_the_plan() -> None:
    from config.dataset import dataset_info_of

    own = {"task": "binary-class", "classes": ["normal", "mass"], "spatial_dims": 3,
           "spacing": "stretch", "slice_tolerance": 0.2, "intensity": "range"}  # fmt: skip
    params = Params.model_validate(
        {"data": {"dataset": "adrenal-ct", "size": 16, "own": own},
         "model": {"name": "small_cnn3d"}, "eval": {"where": "sites"},
         "noniid": {"every": 0, "final": False},
         "federation": {"runtime": "flower", "sites": [{"name": "a", "node_id": 1, "samples": 4}]}}
    )  # fmt: skip
    volumes = site_task(params, dataset_info_of(params.data))

    plan = training_plan(volumes)

    assert {key: plan[key] for key in VOLUME_FIELDS} == {
        "spatial_dims": 3, "spacing": "stretch", "slice_tolerance": 0.2,
    }  # fmt: skip
    assert SiteTask.from_config(plan).dataset_info() == dataset_info_of(params.data)
    assert plan_differences(plan, replace(volumes, spacing="isotropic")) == [
        "spacing=isotropic (approved stretch)"
    ]
