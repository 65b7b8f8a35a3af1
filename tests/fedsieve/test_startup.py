"""The garbage collector is paused only while a process starts, and always comes back; a
process that owns itself freezes what it imported."""

import gc
import os
from collections.abc import Callable

import pytest

from fedsieve import startup


@pytest.fixture(autouse=True)
def collector_running():
    gc.enable()
    yield
    startup.resume_collector()
    gc.enable()


def test_a_block_runs_with_the_collector_paused_and_resumes_it_even_when_it_fails():
    with pytest.raises(RuntimeError), startup.collector_paused():
        assert not gc.isenabled()
        raise RuntimeError("an import failed")
    assert gc.isenabled()


def test_a_collector_someone_else_turned_off_stays_off():
    gc.disable()
    with startup.collector_paused():
        pass
    assert not startup.pause_collector()
    startup.resume_collector()
    assert not gc.isenabled()


def test_the_command_pause_spans_calls_and_resumes_once():
    assert startup.pause_collector()
    assert not startup.pause_collector()  # already paused: not this call's to resume
    with startup.collector_paused():  # a warm-up inside the pause leaves it paused
        pass
    assert not gc.isenabled()
    startup.resume_collector()
    assert gc.isenabled()
    startup.resume_collector()  # again: nothing
    assert gc.isenabled()


def test_a_child_forked_during_the_pause_runs_its_collector():
    # the tracking process is forked while the command's imports run with it paused
    startup.pause_collector()
    assert in_a_fork(gc.isenabled)
    assert not gc.isenabled()  # the parent's pause goes on


def in_a_fork(check: Callable[[], bool]) -> bool:
    """``check()`` run in a forked child (freezing is for good: never in the test's own
    process); its answer."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write_end, b"1" if check() else b"0")
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        passed = answer.read() == b"1"
    os.waitpid(pid, 0)
    return passed


def test_a_pause_meant_to_freeze_moves_what_is_alive_out_of_the_collectors_sight():
    def imports_then_frozen() -> bool:
        with startup.collector_paused(freeze=True):
            imported = [{"module": i} for i in range(50_000)]  # what imports leave alive
        frozen = gc.get_freeze_count()
        young = gc.get_count()[0]  # tracked objects the next collection would scan
        return gc.isenabled() and frozen > len(imported) and young < len(imported)

    assert in_a_fork(imports_then_frozen)


def test_a_child_forked_during_a_freezing_pause_freezes_what_it_inherited():
    def parent_pauses_then_forks() -> bool:
        startup.pause_collector(freeze=True)
        return in_a_fork(lambda: gc.isenabled() and gc.get_freeze_count() > 0)

    assert in_a_fork(parent_pauses_then_forks)


def test_a_plain_pause_freezes_nothing():
    frozen = gc.get_freeze_count()
    with startup.collector_paused():
        kept = [{"module": i} for i in range(1_000)]
    assert gc.get_freeze_count() == frozen
    assert len(kept) == 1_000
