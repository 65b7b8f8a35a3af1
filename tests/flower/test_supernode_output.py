"""How ``fedsieve-site`` reads its SuperNode's output, against a stand-in for
``flower-supernode`` that prints what Flower 1.32.1 prints: the refusal is read from every
line before the join, whatever the SuperExec it starts prints in between."""

from __future__ import annotations

import io
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from flowerapp import supernode
from flowerapp.supernode import (
    EXIT_KEY_IN_USE,
    EXIT_KEY_REFUSED,
    EXIT_SUPERNODE,
    Site,
    run_supernode,
)
from tests.limits import limit

STILL_ONLINE = textwrap.dedent(
    """
    import subprocess, sys, time
    print("INFO :      Starting Flower SuperNode", flush=True)
    # the SuperExec, started before the SuperNode connects, shares its output
    exec_ = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3); "
        "print('WARNING :   Connection attempt failed, retrying in 0.46 seconds', flush=True)"])
    print("ERROR :     <_InactiveRpcError of RPC that terminated with:", flush=True)
    print('\\tdetails = "SuperNode with node ID 42 could not be activated."', flush=True)
    print("Traceback (most recent call last):", flush=True)
    print("RuntimeError: generator didn't yield", flush=True)
    exec_.wait()  # its warning arrives after the refusal, before the SuperNode is gone
    sys.exit(1)
    """
)

HUB_AWAY = textwrap.dedent(
    """
    import sys, time
    print("INFO :      Starting Flower SuperNode", flush=True)
    for _ in range(6):
        print("WARNING :   Connection attempt failed, retrying in 0.2 seconds", flush=True)
        time.sleep(0.2)
    print("ERROR :     the hub never answered", flush=True)
    sys.exit(1)
    """
)


def supervise(
    script: str, tmp_path: Path, rejoin_timeout: float = 0.0, *args: str,
    out: io.StringIO | None = None,
) -> tuple[int, str]:  # fmt: skip
    """The stand-in ``script`` (given ``args``) run as fedsieve-site runs flower-supernode:
    its exit code and what the site said (into ``out`` as it goes, when given)."""
    stand_in = tmp_path / "flower_supernode.py"
    stand_in.write_text(script)
    out = out if out is not None else io.StringIO()
    site = Site("127.0.0.1:9092", tmp_path / "ca.crt", tmp_path / "site.key")
    code = run_supernode(
        [sys.executable, str(stand_in), *args], {}, site, rejoin_timeout=rejoin_timeout, out=out
    )
    return code, out.getvalue()


def test_a_node_still_online_is_waited_for_though_the_superexec_warns_after_the_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supernode, "RETRY_S", 0.1)
    code, out = supervise(STILL_ONLINE, tmp_path)
    assert code == EXIT_KEY_IN_USE, out
    assert "(node 42) online; waiting until its heartbeat lapses" in out
    assert "node 42 is still online after 0 s" in out
    assert "Traceback" not in out and "ERROR" not in out and "WARNING" not in out, out


STILL_ONLINE_THEN_JOINED = textwrap.dedent(
    """
    import pathlib, sys
    tried = pathlib.Path(sys.argv[1])
    if not tried.exists():  # the first try: the hub still counts the old node online
        tried.touch()
        print('\\tdetails = "SuperNode with node ID 42 could not be activated."', flush=True)
        sys.exit(1)
    print("INFO :      SuperNode ID: 42", flush=True)
    """
)


def test_the_rejoin_line_counts_from_the_sites_process_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site that took 90 s to read and check its data before its SuperNode's first try
    says 90 s, not the seconds since that try."""
    monkeypatch.setattr(supernode, "RETRY_S", 0.1)
    stand_in = tmp_path / "flower_supernode.py"
    stand_in.write_text(STILL_ONLINE_THEN_JOINED)
    out = io.StringIO()
    site = Site("127.0.0.1:9092", tmp_path / "ca.crt", tmp_path / "site.key")

    code = run_supernode(
        [sys.executable, str(stand_in), str(tmp_path / "tried")], {}, site, out=out,
        process_started=time.time() - 90,
    )  # fmt: skip

    assert code == 0, out.getvalue()
    rejoined = out.getvalue().splitlines()[-1]
    assert rejoined in [
        f"fedsieve-site: rejoined as node 42, {seconds} s after this site's process started"
        for seconds in (90, 91, 92)
    ], out.getvalue()


def test_a_supernode_waiting_on_an_absent_hub_is_shown_and_its_last_error_quoted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supernode, "HOLD_S", 0.5)
    code, out = supervise(HUB_AWAY, tmp_path)
    assert code == EXIT_SUPERNODE, out
    lines = out.splitlines()
    assert lines[0] == "INFO :      Starting Flower SuperNode"  # held, then shown once waiting
    assert sum("Connection attempt failed" in line for line in lines) == 6
    assert lines[-1] == (
        "fedsieve-site: error: flower-supernode exited with 1 before joining: "
        "ERROR :     the hub never answered"
    )


REFUSED_THEN_STUCK = textwrap.dedent(
    """
    import signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stuck on its way out: only SIGKILL ends it
    print("INFO :      Starting Flower SuperNode", flush=True)
    print("ERROR :     <_InactiveRpcError of RPC that terminated with:", flush=True)
    print('\\tdetails = "No SuperNode found with the given public key."', flush=True)
    print("RuntimeError: generator didn't yield", flush=True)
    time.sleep(600)
    """
)


def test_a_refused_supernode_that_does_not_exit_is_stopped_and_the_refusal_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supernode, "STOP_GRACE", 0.5)
    started = time.monotonic()

    code, out = supervise(REFUSED_THEN_STUCK, tmp_path)

    assert code == EXIT_KEY_REFUSED, out
    assert time.monotonic() - started < 30  # SIGTERM, then SIGKILL, not the child's 600 s
    [line] = out.splitlines()
    assert line.startswith("fedsieve-site: error: ") and "does not know this site's key" in line


JOINED_THEN = textwrap.dedent(
    """
    import sys
    print("INFO :      Starting Flower SuperNode", flush=True)
    print("INFO :      SuperNode ID: 7", flush=True)
    print("INFO :      SuperNode terminated gracefully.", flush=True)
    print("Traceback (most recent call last):", flush=True)
    print('  File "connection.py", line 244, in deactivate_node', flush=True)
    {midway}
    print("grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated with:",
          flush=True)
    print('\\tdetails = "{details}"', flush=True)
    print(">", flush=True)
    print("Traceback (most recent call last):", flush=True)
    print("KeyboardInterrupt", flush=True)
    {after}
    sys.exit(1)
    """
)


# the SuperExec shares the SuperNode's output; started late on a busy machine, it logs in
# the middle of the SuperNode's traceback (seen in CI)
SUPEREXEC_MIDWAY = 'print("INFO :      Starting Flower SuperExec", flush=True)'
# a chained traceback: the revocation is read in its last part
CHAINED = (
    'print("During handling of the above exception, another exception occurred:", flush=True); '
    'print("Traceback (most recent call last):", flush=True)'
)


@pytest.mark.parametrize("midway", ["", SUPEREXEC_MIDWAY, CHAINED])
def test_a_revoked_key_is_one_line_without_flowers_traceback(tmp_path: Path, midway: str) -> None:
    script = JOINED_THEN.format(details="Invalid node ID", after="", midway=midway)
    code, out = supervise(script, tmp_path)
    assert code == EXIT_KEY_REFUSED, out
    assert "Traceback" not in out and "Invalid node ID" not in out, out
    assert out.splitlines()[-1].startswith("fedsieve-site: error: the hub 127.0.0.1:9092 no")
    assert "(node 7 was unregistered)" in out.splitlines()[-1]


@pytest.mark.parametrize("midway", ["", SUPEREXEC_MIDWAY])
@pytest.mark.parametrize("after", ["", 'print("INFO :      after it", flush=True)'])
def test_any_other_traceback_of_a_joined_node_is_passed_through_whole(
    tmp_path: Path, after: str, midway: str
) -> None:
    script = JOINED_THEN.format(details="Socket closed", after=after, midway=midway)
    code, out = supervise(script, tmp_path)
    assert code == 1, out
    lines = out.splitlines()
    others = ["INFO :      after it", "INFO :      Starting Flower SuperExec"]
    assert [line for line in lines if line not in others] == [
        "INFO :      Starting Flower SuperNode",
        "INFO :      SuperNode ID: 7",
        "INFO :      SuperNode terminated gracefully.",
        "Traceback (most recent call last):",
        '  File "connection.py", line 244, in deactivate_node',
        "grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated with:",
        '\tdetails = "Socket closed"',
        ">",
        "Traceback (most recent call last):",
        "KeyboardInterrupt",
    ], out  # each traceback whole, in order; the other process's lines beside them
    assert [line for line in lines if line in others] == [
        *(others[1:] if midway else []),
        *(others[:1] if after else []),
    ], out


JOINED_GOES_ON = textwrap.dedent(
    """
    import pathlib, sys, time
    print("INFO :      SuperNode ID: 7", flush=True)
    print("Traceback (most recent call last):", flush=True)
    print("ConnectionResetError: a transient fault", flush=True)
    go_on = pathlib.Path(sys.argv[1])
    while not go_on.exists():  # the node runs on, saying nothing, until the test has read it
        time.sleep(0.05)
    print("INFO :      later", flush=True)
    """
)


def test_the_traceback_of_a_node_that_runs_on_is_shown_once_it_is_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supernode, "TRACEBACK_QUIET_S", 0.3)
    go_on = tmp_path / "go-on"
    out, shown_while_running = io.StringIO(), threading.Event()

    def let_it_go_on_once_shown() -> None:
        deadline = time.monotonic() + limit(60)
        while time.monotonic() < deadline:
            if "ConnectionResetError" in out.getvalue():
                shown_while_running.set()
                break
            time.sleep(0.05)
        go_on.touch()

    watcher = threading.Thread(target=let_it_go_on_once_shown, daemon=True)
    watcher.start()
    code, said = supervise(JOINED_GOES_ON, tmp_path, 0.0, str(go_on), out=out)
    watcher.join()
    assert code == 0 and shown_while_running.is_set(), said
    assert said.splitlines() == [
        "INFO :      SuperNode ID: 7",
        "Traceback (most recent call last):",
        "ConnectionResetError: a transient fault",
        "INFO :      later",
    ]  # shown while the node ran on, before its next line
