"""A setting's allowed values are declared once, on the engine part that takes it
(registry.constraints), and the params layer reads that declaration: both refuse the same
values in the same words."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from pydantic import AfterValidator, BaseModel

from config.params import ConfigError, Params, load_params
from federated.client import LocalTraining
from federated.parts import Execution, FederationConfig
from federated.privacy import ClientPrivacy
from registry.constraints import Interval, Options, check, declared, describe

PARAMS = "params.yaml"


@pytest.mark.parametrize(
    ("constraint", "inside", "outside", "words"),
    [
        (Interval(int, 1), [1, 7], [0, -3, 1.0, True, None, "2"], "an integer >= 1"),
        (Interval(float, 0, 1, closed="left"), [0, 0.0, 0.5], [1, 1.5, -0.1, math.nan, False],
         "a number in [0, 1)"),
        (Interval(float, 0, 1, closed="right"), [1, 0.25], [0, 1.01], "a number in (0, 1]"),
        (Interval(float, 0, closed="neither"), [1e-9, 3], [0, -1, math.inf, math.nan],
         "a finite number > 0"),
        (Options(("last", "best_val")), ["last", "best_val"], ["Last", None, 0],
         "one of 'last', 'best_val'"),
    ],
)  # fmt: skip
def test_a_constraint_allows_what_its_words_say(constraint, inside, outside, words):
    assert str(constraint) == words
    for value in inside:
        check("x", value, (constraint,))
    for value in outside:
        with pytest.raises(ValueError, match=rf"^x must be {_escaped(words)}, got "):
            check("x", value, (constraint,))


def test_none_is_allowed_only_where_declared_and_named_in_the_reader_s_words():
    count_or_none = (Interval(int, 0), None)
    check("max_parallel", None, count_or_none)
    assert describe(count_or_none) == "an integer >= 0 or None"
    assert describe(count_or_none, none="null") == "an integer >= 0 or null"
    with pytest.raises(ValueError, match=r"^rounds must be an integer >= 1, got None$"):
        check("rounds", None, (Interval(int, 1),))


def _engine_declared_settings() -> list[tuple[str, type, str]]:
    """Every params key whose bound the params layer takes from an engine part:
    (dotted key, part, field)."""
    found = []
    for section, info in Params.model_fields.items():
        model = info.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        for key, field in model.model_fields.items():
            for item in field.metadata:
                if isinstance(item, AfterValidator) and hasattr(item.func, "declared_by"):
                    part, name = item.func.declared_by
                    found.append((f"{section}.{key}", part, name))
    return found


def _outside(part: type, name: str) -> Any:
    """A value the declaration refuses: just below its lower bound."""
    first = declared(part, name)[0]
    assert isinstance(first, Interval) and first.low is not None
    return first.low - 1 if first.kind is int else first.low - 0.5


def test_the_params_layer_reads_its_bounds_from_the_engine_parts():
    settings = _engine_declared_settings()
    keys = {key for key, _, _ in settings}
    # the settings the engine's parts take, each bounded once, in the engine
    assert {"train.rounds", "train.momentum", "train.local_epochs", "train.max_parallel",
            "train.max_excluded", "eval.every", "eval.target_acc", "noniid.z"} <= keys  # fmt: skip
    assert len(settings) >= 15


@pytest.mark.parametrize(("key", "part", "name"), _engine_declared_settings())
def test_params_and_the_engine_refuse_the_same_value_in_the_same_words(key, part, name):
    bad = _outside(part, name)
    allowed = describe(declared(part, name))
    with pytest.raises(ValueError, match=rf"^{name} must be {_escaped(allowed)}, got "):
        part(**{**_required(part), name: bad})
    with pytest.raises(ConfigError) as refused:
        load_params(PARAMS, [f"{key}={bad}"])
    message = str(refused.value)
    assert "\n" not in message
    assert message.endswith(f": {key} = {bad}: must be {describe(declared(part, name), 'null')}")


def test_momentum_of_one_or_more_is_refused_before_anything_runs():
    with pytest.raises(ConfigError, match=r"train\.momentum = 1\.5: must be a number in \[0, 1\)$"):
        load_params(PARAMS, ["train.momentum=1.5"])
    with pytest.raises(ValueError, match=r"^momentum must be a number in \[0, 1\), got 1$"):
        LocalTraining(momentum=1)


def _required(part: type) -> dict[str, Any]:
    """The fields a part cannot be built without."""
    required = {
        FederationConfig: {"rounds": 1},
        ClientPrivacy: {"clip": 1.0, "noise_multiplier": 1.0, "population": 10, "per_round": 5},
    }
    return required.get(part, {})


def _escaped(words: str) -> str:
    return re.escape(words)


def test_a_part_built_by_a_library_caller_gets_the_same_checks():
    with pytest.raises(
        ValueError, match=r"^backend must be one of 'sequential', 'batched', 'auto'"
    ):
        Execution(backend="threads")  # type: ignore[arg-type]
