"""Which tests use the session's loopback hub (tests/flower/conftest.py's ``hub``): ``make
test`` deals them to one worker together (tests/conftest.py), which stops the hub after
the last of them."""

from __future__ import annotations

import pytest


def uses_hub(item: pytest.Item) -> bool:
    return "hub" in getattr(item, "fixturenames", ())
