"""A flow that runs stages as subflows keeps its own heartbeat; its subflows send none
(Prefect waits up to 1 s for a flow's heartbeat thread at every flow's end)."""

from prefect import flow
from prefect.settings import get_current_settings

from flows.common import subflows_without_heartbeats


@flow
def stage() -> int | None:
    return get_current_settings().flows.heartbeat_frequency


@flow
def whole() -> tuple[int | None, int | None, int | None]:
    own = get_current_settings().flows.heartbeat_frequency
    with subflows_without_heartbeats():
        inside = stage()
    after = stage()
    return own, inside, after


def test_subflows_in_the_block_send_no_heartbeat_and_the_parent_keeps_its_own(prefect_server):
    own, inside, after = whole()
    assert own is not None and own > 0  # the setting every flow gets on a real server
    assert inside is None
    assert after == own  # only the block's subflows
