"""``fedsieve-site`` as its operator runs it, against the loopback hub: a site killed and
started again at once rejoins by itself, and every refusal the hub gives is one line and
its own exit code, no traceback. Each is run from a bare shell environment (no Flower
``bin`` on PATH, no Flower switches set), as a stranger's would be."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowerapp.certs import SiteKey, make_site_key, make_tls
from flowerapp.hub import HubFiles
from flowerapp.site import main as site_main
from flowerapp.supernode import (
    EXIT_KEY_IN_USE,
    EXIT_KEY_REFUSED,
    EXIT_STOPPED,
    EXIT_TLS,
    EXIT_USAGE,
)
from tests.flower.conftest import Hub, run_at_sites
from tests.limits import limit

TRAINER_READY = r"warm trainer ready on (.*) \(pid (\d+)\)"
RESTART_AFTER_S = 5.0  # the crash-and-restart the issue names: kill -9, start again 5 s later
REJOIN_TIMEOUT = 150.0  # the hub's heartbeat window is 60 s


def bare_env(home: Path) -> dict[str, str]:
    """A login shell's environment: no virtual environment's bin on PATH, no FLWR_*."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}
    if "PYTHONPATH" in os.environ:  # the checkout under test, for an editable install
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def lines_since(log: Path, start: int) -> list[str]:
    return log.read_bytes()[start:].decode(errors="replace").splitlines()


def process_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def group_commands(pgid: int) -> dict[int, str]:
    """The command lines of the live processes in a process group, by PID."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2 :].split()[2]) == pgid:
                found[int(entry.name)] = cmdline
    return found


@contextlib.contextmanager
def busy_cores(count: int) -> Iterator[None]:
    """``count`` processes that spin until the block ends (stopped by their PIDs)."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def start_new_site(
    hub: Hub, tmp_path: Path, name: str, env: dict[str, str] | None = None
) -> tuple[SiteKey, int, list[str], subprocess.Popen[bytes]]:
    """A new site's key registered and the site started as its operator starts it
    (``fedsieve-site`` on site-0's data and the hub's plan), admitted: its key, node id,
    command and process."""
    key = make_site_key(tmp_path, name)
    node = hub.fed.register(key.public)
    command = hub.fed.site_command(key, hub.files["site-0"], hub.plan)
    site = hub.fed.start_site_command(name, command, env)
    assert hub.fed.wait_connected(name) == node
    return key, node, command, site


def test_a_site_killed_and_started_again_at_once_waits_and_rejoins(
    hub: Hub, tmp_path: Path
) -> None:
    fed, name = hub.fed, "phoenix"
    _, node, command, site = start_new_site(hub, tmp_path, name, bare_env(tmp_path))
    # the SuperNode found flower-superexec without the venv on PATH, Flower's switches set
    supernodes = [pid for pid, cmd in group_commands(site.pid).items() if "flower-supernode" in cmd]
    deadline = time.monotonic() + limit(60)
    while not any("flower-superexec" in c for c in group_commands(site.pid).values()):
        assert time.monotonic() < deadline, fed.site_log(name).read_text()[-2000:]
        time.sleep(0.5)
    env = process_env(supernodes[0])
    assert env["FLWR_TELEMETRY_ENABLED"] == "0" and env["FLWR_DISABLE_UPDATE_CHECK"] == "1"
    assert "--allow-runtime-dependency-installation" not in " ".join(command)

    private = Path(fed.wait_line(name, TRAINER_READY).group(1)).parent
    assert private.exists()
    os.kill(site.pid, signal.SIGKILL)  # kill -9 of fedsieve-site alone: its children go too
    deadline = time.monotonic() + limit(60)
    while any(
        part in c for c in group_commands(site.pid).values()
        for part in ("flower-supernode", "flowerapp.trainer")
    ) or private.exists():  # fmt: skip
        assert time.monotonic() < deadline, "a child or the trainer's key outlived the site"
        time.sleep(0.5)
    fed.kill_site(name)  # reaped
    # The SuperNode, sent SIGTERM by the kernel, deactivates its node on the way out; that
    # last message is Flower's best effort (one try, 5 s to exit), and when it did not
    # reach the hub the node stays online until its heartbeat lapses, as after a crash.
    deactivated = fed.node_status(node) == "offline"
    start = fed.site_log(name).stat().st_size
    site = fed.start_site_command(name, command, bare_env(tmp_path))
    assert fed.wait_connected(name, timeout=REJOIN_TIMEOUT) == node  # the port free at once
    waited = [line for line in lines_since(fed.site_log(name), start) if "waiting until" in line]
    assert len(waited) == (0 if deactivated else 1), waited  # at once when the node was let go

    fed.kill_site(
        name
    )  # kill -9 of the whole site: the hub counts the node online until its heartbeat lapses
    time.sleep(RESTART_AFTER_S)
    log = fed.site_log(name)
    start = log.stat().st_size
    launched = time.time()  # the site's process starts after this
    fed.start_site_command(name, command, bare_env(tmp_path))
    assert fed.wait_connected(name, timeout=REJOIN_TIMEOUT) == node
    rejoined = fed.wait_line(name, rf"rejoined as node {node}, (\d+) s after this site's process")
    # the line's clock is the process's, which includes the site's data check: it says
    # the time from the launch to the line (read within a poll of its writing)
    assert abs(int(rejoined.group(1)) - (time.time() - launched)) <= 2, rejoined.group(0)
    assert fed.node_status(node) == "online"
    lines = lines_since(log, start)
    waiting = [line for line in lines if "waiting until its heartbeat lapses" in line]
    assert len(waiting) == 1 and f"(node {node})" in waiting[0], lines
    assert any(f"rejoined as node {node}" in line for line in lines), lines
    assert not any("Traceback" in line or "ERROR" in line for line in lines), lines
    restarted = fed.sites[name]
    restarted.send_signal(signal.SIGTERM)  # docker stop, systemctl stop (KillMode=mixed)
    assert restarted.wait(timeout=limit(60)) == EXIT_STOPPED
    assert fed.node_status(node) == "offline"  # the SuperNode deactivated its node on the way out
    fed.stop_site(name)


def test_the_sites_warm_trainer_is_started_again_and_trains_the_next_run(
    hub: Hub, tmp_path: Path
) -> None:
    fed, name = hub.fed, "warm"
    _, node, _, _ = start_new_site(hub, tmp_path, name)
    first = int(fed.wait_line(name, TRAINER_READY).group(2))
    start = fed.site_log(name).stat().st_size
    os.kill(first, signal.SIGKILL)
    assert fed.wait_line(
        name, rf"warm trainer \(pid {first}\) exited with -9; starting", since=start
    )
    second = int(fed.wait_line(name, TRAINER_READY, since=start).group(2))
    assert second != first

    hub.files[name], hub.nodes[name] = hub.files["site-0"], node
    run_at_sites(hub, hub.flower_params([name, "site-1"]), "warm-restarted")
    exchanges = HubFiles(hub.folder / "warm-restarted").exchanges.read_text().splitlines()
    answers = [json.loads(line)["sites"]["0"] for line in exchanges]
    assert answers and all(phases["warm"] == 1.0 for phases in answers), answers
    fed.stop_site(name)
    assert not Path(f"/proc/{second}").exists()  # stopped with its site


def test_every_refusal_is_one_line_and_its_own_exit_code(hub: Hub, tmp_path: Path) -> None:
    fed = hub.fed
    stranger = make_site_key(tmp_path, "stranger")  # never registered
    other_ca = make_tls(tmp_path / "other-hub").ca_cert
    data, plan = hub.files["site-0"], hub.plan
    cases = {
        "unregistered": (fed.site_command(stranger, data, plan), EXIT_KEY_REFUSED,
                         "does not know this site's key"),
        "wrong-ca": ([*fed.site_command(stranger, data, plan), "--ca", str(other_ca)], EXIT_TLS,
                     "the hub's certificate is not signed by --ca"),
        # site-0 is online: a second SuperNode with its key waits, then says why it gave up
        "key-in-use": (fed.site_command(hub.keys["site-0"], data, plan, "--rejoin-timeout", "1"),
                       EXIT_KEY_IN_USE, "another SuperNode runs with this site's key"),
    }  # fmt: skip
    for name, (command, code, message) in cases.items():
        log = fed.site_log(name)
        proc = fed.start_site_command(name, command, bare_env(tmp_path))
        assert proc.wait(timeout=limit(120)) == code, log.read_text()
        lines = log.read_text().splitlines()
        errors = [line for line in lines if line.startswith("fedsieve-site: error: ")]
        assert len(errors) == 1 and message in errors[0], lines
        assert lines[-1] == errors[0], lines
        assert not any("Traceback" in line or "ERROR" in line for line in lines), lines
        fed.stop_site(name)
    assert fed.node_status(hub.nodes["site-0"]) == "online"  # the real site-0 untouched


def test_a_site_whose_key_is_revoked_while_it_runs_stops_and_says_why(
    hub: Hub, tmp_path: Path
) -> None:
    """On a machine whose cores are busy (two spinning processes), the revocation meets the
    site while its warm trainer is still starting: it stays one line, the last."""
    fed, name = hub.fed, "revoked"
    with busy_cores(2):
        key, node, _, site = start_new_site(hub, tmp_path, name)
        fed.unregister(node)
        assert site.wait(timeout=limit(120)) == EXIT_KEY_REFUSED
    lines = fed.site_log(name).read_text().splitlines()
    assert lines[-1] == (
        f"fedsieve-site: error: the hub {fed.fleet_address} no longer accepts this site's "
        f"key {key.private} (node {node} was unregistered)"
    ), lines[-20:]
    faults = [k for k, line in enumerate(lines) if "Traceback" in line or "Error" in line]
    assert not faults, "\n".join(lines[max(faults[0] - 5, 0) : faults[-1] + 5])
    fed.stop_site(name)  # nothing it started outlives it


def test_a_key_certificate_or_port_the_site_cannot_use_is_named_before_it_starts(
    hub: Hub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = make_site_key(tmp_path, "site")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        cases = {
            "not a PEM certificate": ["--ca", str(hub.plan)],
            "not an unencrypted OpenSSH EC private key": ["--key", str(hub.fed.tls.ca_cert)],
            "No such file or directory": ["--key", str(tmp_path / "none.key")],
            "Address already in use (another site on this host?": ["--clientappio-port", port],
        }
        for message, options in cases.items():
            argv = [*hub.fed.site_command(key, hub.files["site-0"], hub.plan)[1:], *options]
            assert site_main(argv) == EXIT_USAGE, message
            error = capsys.readouterr().err
            assert error.startswith("fedsieve-site: error: ") and error.count("\n") == 1, error
            assert message in error, error
