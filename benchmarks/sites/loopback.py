"""A Flower federation on 127.0.0.1 for tests and benchmarks: TLS on, SuperNode auth on.

    with Loopback() as fed:
        fed.start_superlink()
        key = make_site_key(fed.work / "keys", "site-a")
        node_id = fed.register(key.public)
        fed.start_site("site-a", key, {"data-file": "/data/site-a.npz"})
        fed.wait_connected("site-a")
        result = fed.run_app(app_dir, {"rounds": 2})

Every server binds 127.0.0.1 only, on ports picked free when the Loopback is made (the
SuperLink keeps them across restarts, so SuperNodes find it again). Every process starts in
its own session, so its PID is also the id of a process group holding the helpers it spawns
(SuperExec, ServerApp, ClientApp); processes are stopped by that PID, never by name.
Runtime dependency installation (`uv sync` of the app's dependencies) is disabled: apps run
in this interpreter's environment, hermetically.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from flowerapp.certs import SiteKey, TlsFiles, make_tls
from flowerapp.flwr_config import ConfigValue, config_pairs, flower_env, write_cli_config
from flowerapp.trainer import prepare_dir, trainer_command

HOST = "127.0.0.1"
CONNECTION = "loopback"  # the SuperLink connection name in the flwr CLI config
START_TIMEOUT = 60.0  # seconds for a SuperLink to bind its ports / a SuperNode to connect
STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL
CLI_TIMEOUT = 60.0  # seconds for one flwr CLI command (register, ls, ...)

_NODE_ID_LINE = re.compile(r"SuperNode ID: (\d+)")


def free_ports(count: int) -> list[int]:
    """Distinct free TCP ports on 127.0.0.1 (all held open together, so none repeats)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def port_open(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:port."""
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) PIDs in process group `pgid`.

    Zombies are skipped: an orphan whose reaper is slow (or a container's PID 1 that never
    reaps) must not make a stopped group look alive.
    """
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: ask the kernel whether the group still exists
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _command_line(pid: int) -> str:
    """The process's command line ('' once it is gone)."""
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to every process of the group (gone already is fine)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _wait_group(proc: subprocess.Popen[Any], timeout: float) -> bool:
    """Wait until the leader has exited and its group is empty; False at the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _group_members(proc.pid):
            return True
        time.sleep(0.05)
    return False


def stop_group(
    proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, grace: float = STOP_GRACE
) -> int | None:
    """Stop a process started with `start_new_session=True` and everything it spawned.

    Sends `sig` to the group whose id is the process's PID, waits up to `grace` seconds,
    then SIGKILLs what is left. Returns the leader's exit code.
    """
    if proc.poll() is not None and not _group_members(proc.pid):
        return proc.returncode  # already gone: never signal a group id that may be reused
    _signal_group(proc.pid, sig)
    if not _wait_group(proc, grace) and sig != signal.SIGKILL:
        _signal_group(proc.pid, signal.SIGKILL)
        _wait_group(proc, grace)
    try:
        return proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        return None


class Loopback:
    """A SuperLink and SuperNodes on 127.0.0.1, all started and stopped by this object.

    `work` holds the TLS files, the SuperLink database, one FLWR_HOME per process, the flwr
    CLI configuration and one log per process. A work dir made here (none given) is deleted
    on exit unless `keep=True`.
    """

    def __init__(
        self,
        work_dir: Path | None = None,
        *,
        bin_dir: Path | None = None,
        keep: bool = False,
    ) -> None:
        """Pick the ports, write (or reuse) the TLS files and the flwr CLI configuration."""
        self._own_work = work_dir is None
        self.work = (
            Path(tempfile.mkdtemp(prefix="fedsieve-loopback-"))
            if work_dir is None
            else work_dir.resolve()
        )
        self.work.mkdir(parents=True, exist_ok=True)
        # flower-superlink / flower-supernode spawn `flower-superexec` through PATH, so the
        # bin dir of the environment Flower is installed in must come first there.
        self.bin_dir = bin_dir or Path(sys.executable).parent
        self.keep = keep
        self.tls = self._tls_files()
        self.fleet_port, self.control_port, self.serverappio_port = free_ports(3)
        self.database = self.work / "superlink.db"
        self.flwr_home = self.work / "flwr-home"
        self._write_flwr_config()
        self.superlink: subprocess.Popen[bytes] | None = None
        self.sites: dict[str, subprocess.Popen[bytes]] = {}
        self.app_runs: dict[int, tuple[subprocess.Popen[bytes], Path]] = {}
        self._logs: dict[int, IO[bytes]] = {}
        self._site_log_start: dict[str, int] = {}

    # -- addresses and environment ---------------------------------------------------------

    @property
    def fleet_address(self) -> str:
        """Where SuperNodes connect (`flower-supernode --superlink`)."""
        return f"{HOST}:{self.fleet_port}"

    @property
    def control_address(self) -> str:
        """Where the flwr CLI connects (runs, node registration)."""
        return f"{HOST}:{self.control_port}"

    def _tls_files(self) -> TlsFiles:
        """Reuse the certificates of a kept work dir, so running SuperNodes still trust it."""
        certs = self.work / "certs"
        files = TlsFiles(
            certs / "ca.crt", certs / "ca.key", certs / "server.pem", certs / "server.key"
        )
        if all(path.is_file() for path in vars(files).values()):
            return files
        return make_tls(certs, overwrite=True)

    def _write_flwr_config(self) -> None:
        """flwr CLI config: the default connection is this SuperLink's Control API over TLS."""
        write_cli_config(self.flwr_home, CONNECTION, self.control_address, self.tls.ca_cert)

    def _env(self, flwr_home: Path) -> dict[str, str]:
        """Environment for one Flower process: its own FLWR_HOME, no telemetry, no network."""
        return flower_env(self.bin_dir) | {"FLWR_HOME": str(flwr_home)}

    def flwr_env(self) -> dict[str, str]:
        """Environment in which `flwr ...` commands talk to this SuperLink by default."""
        return self._env(self.flwr_home)

    def _spawn(
        self, cmd: list[str], log: Path, flwr_home: Path, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start `cmd` in a new session (PID = group id), appending its output to `log`;
        in `env` when given (FLWR_HOME added), else in `_env`."""
        flwr_home.mkdir(parents=True, exist_ok=True)
        out = log.open("ab")
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=self.work,
            env=self._env(flwr_home) if env is None else {**env, "FLWR_HOME": str(flwr_home)},
            start_new_session=True,
        )
        self._logs[proc.pid] = out
        return proc

    def _reap(self, proc: subprocess.Popen[bytes], sig: int, grace: float) -> int | None:
        """Stop a process group we started and close its log."""
        code = stop_group(proc, sig, grace)
        log = self._logs.pop(proc.pid, None)
        if log is not None:
            log.close()
        return code

    # -- SuperLink -------------------------------------------------------------------------

    def start_superlink(
        self, database: Path | None = None, timeout: float = START_TIMEOUT
    ) -> subprocess.Popen[bytes]:
        """Start the SuperLink and return once its three APIs accept connections.

        The database is a file (by default `work/superlink.db`), so a restart after
        `kill_superlink` keeps the registered SuperNode keys and their node ids. It is the
        hub operator's command (`python -m flowerapp.superlink`, docs/federation.md).
        """
        if self.superlink is not None and self.superlink.poll() is None:
            raise RuntimeError("the SuperLink is already running")
        if database is not None:
            self.database = database
        cmd = [
            str(self.bin_dir / "python"), "-m", "flowerapp.superlink",  # the hub's command
            "--certs", str(self.tls.ca_cert.parent),
            "--database", str(self.database),
            "--fleet-api-address", self.fleet_address,
            "--control-api-address", self.control_address,
            "--serverappio-api-address", f"{HOST}:{self.serverappio_port}",
        ]  # fmt: skip
        log = self.work / "superlink.log"
        self.superlink = self._spawn(cmd, log, self.work / "home" / "superlink")
        ports = (self.control_port, self.serverappio_port, self.fleet_port)
        deadline = time.monotonic() + timeout
        while not all(port_open(port) for port in ports):
            if self.superlink.poll() is not None:
                raise RuntimeError(
                    f"flower-superlink exited with {self.superlink.returncode}; see {log}"
                )
            if time.monotonic() > deadline:
                self._reap(self.superlink, signal.SIGKILL, STOP_GRACE)
                raise TimeoutError(f"SuperLink not ready after {timeout:.0f} s; see {log}")
            time.sleep(0.1)
        return self.superlink

    def kill_superlink(self, sig: int = signal.SIGKILL) -> int | None:
        """Kill the SuperLink and everything it spawned (SuperExec, ServerApps): a hub crash.

        With SIGKILL nothing is flushed or deregistered; `start_superlink` afterwards reopens
        the same database on the same ports. Returns the SuperLink's exit code.
        """
        if self.superlink is None:
            return None
        code = self._reap(self.superlink, sig, STOP_GRACE)
        self.superlink = None
        return code

    def serverapps_left(self, timeout: float = STOP_GRACE) -> list[str]:
        """Wait until no ServerApp process (``flwr-serverapp``) the SuperLink started is
        alive; the command lines of those still alive at ``timeout`` (none: every run's
        ServerApp ended with its run)."""
        if self.superlink is None:
            return []
        deadline = time.monotonic() + timeout
        while True:
            left = list(self._serverapps(self.superlink.pid).values())
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.1)

    @staticmethod
    def _serverapps(superlink: int) -> dict[int, str]:
        """The ServerApp processes (``flwr-serverapp``) alive in the SuperLink's group: each
        PID and its command line."""
        lines = {pid: _command_line(pid) for pid in _group_members(superlink)}
        return {pid: line for pid, line in lines.items() if "flwr-serverapp" in line}

    def serverapp_stacks(self, stacks: Path, timeout: float = STOP_GRACE) -> str:
        """Where each ServerApp process still alive waits: SIGUSR1 has each append every
        thread's stack to its run's ``stacks`` file (:attr:`flowerapp.hub.HubFiles.stacks`);
        what the file gained (a dump per process, or what came by ``timeout``)."""
        if self.superlink is None:
            return ""
        start = stacks.stat().st_size if stacks.exists() else 0
        left = list(self._serverapps(self.superlink.pid))
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while True:
            gained = stacks.read_bytes()[start:].decode(errors="replace") if stacks.exists() else ""
            if gained.count("Current thread") >= len(left) or time.monotonic() >= deadline:
                return gained
            time.sleep(0.1)

    def stop_superlink(self, grace: float = STOP_GRACE) -> int | None:
        """Stop the SuperLink gracefully (SIGTERM, SIGKILL after `grace` seconds)."""
        if self.superlink is None:
            return None
        code = self._reap(self.superlink, signal.SIGTERM, grace)
        self.superlink = None
        return code

    # -- flwr CLI --------------------------------------------------------------------------

    def flwr(
        self, *args: str, timeout: float = CLI_TIMEOUT, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run one `flwr` CLI command against this SuperLink (in its own process group)."""
        cmd = [str(self.bin_dir / "flwr"), *args]
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=self.work,
            env=self.flwr_env(),
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc, signal.SIGKILL)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
        done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        if check and done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, cmd, out, err)
        return done

    def _flwr_json(self, *args: str) -> dict[str, Any]:
        """Run a `flwr ... --format json` command; raise with its error unless it succeeded."""
        done = self.flwr(*args, "--format", "json", check=False)
        try:
            data: dict[str, Any] = json.loads(done.stdout)
        except json.JSONDecodeError:
            data = {"success": False, "error-message": done.stdout + done.stderr}
        if done.returncode != 0 or not data.get("success"):
            raise RuntimeError(f"flwr {' '.join(args)} failed: {data}")
        return data

    def register(self, public_key: Path) -> int:
        """Register a site's public key; returns the node id the SuperLink gives it.

        With `--enable-supernode-auth` only registered keys can connect, and the node keeps
        this id (it is what the ServerApp sees as `dst_node_id`) for as long as the key
        stays registered, across SuperNode and SuperLink restarts.
        """
        data = self._flwr_json("supernode", "register", str(public_key))
        return int(data["node-id"])

    def unregister(self, node_id: int) -> None:
        """Remove a node's key from the federation; its SuperNode is refused from then on."""
        self._flwr_json("supernode", "unregister", str(node_id))

    def nodes(self) -> list[dict[str, Any]]:
        """The SuperLink's view of the nodes (`flwr supernode ls`): id, status, key, times."""
        return list(self._flwr_json("supernode", "ls")["nodes"])

    def node_status(self, node_id: int) -> str | None:
        """One node's status (`registered`, `online`, `offline`, ...), None if unknown."""
        for node in self.nodes():
            if int(node["node-id"]) == node_id:
                return str(node["status"])
        return None

    def wait_status(
        self, node_ids: Iterable[int], status: str = "online", timeout: float = START_TIMEOUT
    ) -> float:
        """Wait until the SuperLink reports every node in `status`; returns the seconds waited.

        "online" after a (re)connect; "offline" once a crashed SuperNode's heartbeat has
        lapsed (up to 2 x 30 s), which is when the same key may connect again. Each look
        starts a ``flwr`` process (about a CPU-second): one every 2 s, not back to back.
        """
        wanted = set(node_ids)
        start = time.monotonic()
        while True:
            there = {int(n["node-id"]) for n in self.nodes() if n["status"] == status}
            if wanted <= there:
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"nodes {sorted(wanted - there)} not {status} in {timeout} s")
            time.sleep(2)

    # -- SuperNodes ------------------------------------------------------------------------

    def site_log(self, name: str) -> Path:
        """The log a site's SuperNode (and its ClientApps) write to."""
        return self.work / f"{name}.log"

    def start_site(
        self,
        name: str,
        key: SiteKey,
        node_config: Mapping[str, ConfigValue] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start a site's SuperNode: TLS to the SuperLink, authenticated with the site's key.

        No `--max-retries`/`--max-wait-time`: the SuperNode retries connecting forever
        (exponential backoff capped at 20 s), so it outlives SuperLink restarts. The public
        key is derived from the private one (`--auth-supernode-public-key` is deprecated in
        1.32 and only logs a warning).
        """
        (clientappio_port,) = free_ports(1)
        cmd = [
            str(self.bin_dir / "flower-supernode"),
            "--superlink", self.fleet_address,
            "--root-certificates", str(self.tls.ca_cert),
            "--auth-supernode-private-key", str(key.private),
            "--isolation", "subprocess",
            "--clientappio-api-address", f"{HOST}:{clientappio_port}",
        ]  # fmt: skip
        if node_config:
            cmd += ["--node-config", " ".join(config_pairs(node_config))]
        return self.start_site_command(name, cmd)

    def start_trainer(self, name: str, data: Path, plan: Path) -> Path:
        """Start a site's warm trainer, as `fedsieve-site` does beside its SuperNode (here
        it is not started again when it dies: tasks then run in the ClientApp); its
        directory, the SuperNode's `trainer-dir` node config. Logs to the site's log;
        stopped by `stop_site(f"{name}.trainer")` or on `close`."""
        directory = self.work / "trainers" / name
        prepare_dir(directory)
        cmd = trainer_command(directory, data.resolve(), plan.resolve(), self.bin_dir / "python")
        self.sites[f"{name}.trainer"] = self._spawn(
            cmd, self.site_log(name), self.work / "home" / name
        )
        return directory

    def site_command(self, key: SiteKey, data: Path, plan: Path, *options: str) -> list[str]:
        """What a site operator runs (`fedsieve-site`), pointed at this SuperLink."""
        (clientappio_port,) = free_ports(1)
        return [
            str(self.bin_dir / "fedsieve-site"), "--data", str(data), "--plan", str(plan),
            "--superlink", self.fleet_address, "--ca", str(self.tls.ca_cert),
            "--key", str(key.private), "--clientappio-port", str(clientappio_port), *options,
        ]  # fmt: skip

    def start_site_command(
        self, name: str, cmd: list[str], env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start a site as `cmd` (`flower-supernode ...`, `site_command(...)`), in `env`
        when given (as a site operator's shell has it): its own session and log, stopped
        by `stop_site` / `kill_site` with all it started."""
        running = self.sites.get(name)
        if running is not None and running.poll() is None:
            raise RuntimeError(f"site {name} is already running")
        log = self.site_log(name)
        self._site_log_start[name] = log.stat().st_size if log.exists() else 0
        self.sites[name] = self._spawn(cmd, log, self.work / "home" / name, env)
        return self.sites[name]

    def wait_connected(self, name: str, timeout: float = START_TIMEOUT) -> int:
        """Wait until a site's SuperNode has been admitted; returns its node id.

        Reads the site's log ("SuperNode ID: N" is logged after the SuperLink accepted the
        node's key). Raises if the SuperNode exits first, e.g. because its key is not
        registered.
        """
        return int(self.wait_line(name, _NODE_ID_LINE, timeout=timeout).group(1))

    def wait_line(
        self, name: str, pattern: str | re.Pattern[str], *, since: int | None = None,
        timeout: float = START_TIMEOUT,
    ) -> re.Match[str]:  # fmt: skip
        """The first match of ``pattern`` in site ``name``'s log from byte ``since`` on
        (default: where this start of the site began); raises if the site exits first or
        ``timeout`` passes."""
        proc = self.sites[name]
        log = self.site_log(name)
        start = self._site_log_start[name] if since is None else since
        deadline = time.monotonic() + timeout
        while True:
            with log.open("rb") as handle:
                handle.seek(start)
                match = re.search(pattern, handle.read().decode(errors="replace"))
            if match:
                return match
            if proc.poll() is not None:
                raise RuntimeError(f"site {name} exited with {proc.returncode}; see {log}")
            if time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:]  # read where CI keeps no files
                raise TimeoutError(f"site {name}: no {pattern!r} in {timeout} s; {log}:\n{tail}")
            time.sleep(0.1)

    def stop_site(self, name: str, grace: float = STOP_GRACE) -> int | None:
        """Stop a site gracefully (SIGTERM by PID, SIGKILL after `grace`): it deactivates."""
        proc = self.sites.pop(name, None)
        return None if proc is None else self._reap(proc, signal.SIGTERM, grace)

    def kill_site(self, name: str) -> int | None:
        """SIGKILL a site with its SuperExec and ClientApp: a site crash.

        The SuperLink only notices when the heartbeat lapses (up to 60 s): until then the node
        stays "online", messages to it get no reply, and a SuperNode started again with the
        same key is refused ("could not be activated", exit 1). Wait for
        `wait_status([node_id], "offline")` before `start_site` again; a site started as
        `site_command(...)` (`fedsieve-site`) waits by itself.
        """
        proc = self.sites.pop(name, None)
        return None if proc is None else self._reap(proc, signal.SIGKILL, STOP_GRACE)

    # -- runs ------------------------------------------------------------------------------

    def _run_cmd(
        self, app_dir: Path, run_config: Mapping[str, ConfigValue] | None, stream: bool
    ) -> list[str]:
        """`flwr run <app_dir> loopback [--run-config k=v ...] [--stream]`."""
        cmd = [str(self.bin_dir / "flwr"), "run", str(Path(app_dir).resolve()), CONNECTION]
        for pair in config_pairs(run_config or {}):
            cmd += ["--run-config", pair]
        if stream:
            cmd.append("--stream")
        return cmd

    def run_app(
        self,
        app_dir: Path,
        run_config: Mapping[str, ConfigValue] | None = None,
        *,
        stream: bool = True,
        timeout: float = 600.0,
    ) -> subprocess.CompletedProcess[str]:
        """Build the app dir into a FAB, start a run and (with `stream`) wait for its end.

        With `stream` the output holds the ServerApp's log. `flwr run` exits 0 even when the
        ServerApp fails (check the log or `run_status`: "finished:failed"), 1 when a
        `run_config` key is not in the app's `[tool.flwr.app.config]` or the SuperLink dies.
        """
        cmd = self._run_cmd(app_dir, run_config, stream)
        return self.flwr(*cmd[1:], timeout=timeout, check=True)

    def start_app(
        self,
        app_dir: Path,
        run_config: Mapping[str, ConfigValue] | None = None,
        *,
        stream: bool = True,
    ) -> subprocess.Popen[bytes]:
        """`run_app` without waiting: the output goes to `app_log(proc)`."""
        log = self.work / f"run-{len(self.app_runs) + 1}.log"
        proc = self._spawn(self._run_cmd(app_dir, run_config, stream), log, self.flwr_home)
        self.app_runs[proc.pid] = (proc, log)
        return proc

    def app_log(self, proc: subprocess.Popen[bytes]) -> Path:
        """Where a `start_app` process writes its output."""
        return self.app_runs[proc.pid][1]

    def run_status(self, run_id: int) -> dict[str, Any]:
        """A run's record from `flwr list --run-id` (status, sub-status, timings)."""
        runs = self._flwr_json("list", "--run-id", str(run_id))["runs"]
        return dict(runs[0])

    # -- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every process started here, each by its PID: the runs and the sites all
        signalled at once, so that their shutdowns overlap, then the SuperLink, which the
        sites' SuperNodes tell as they deactivate."""
        running = [proc for proc, _ in self.app_runs.values() if proc.pid in self._logs]
        running += [self.sites.pop(name) for name in list(self.sites)]
        for proc in running:
            if proc.poll() is None or _group_members(proc.pid):
                _signal_group(proc.pid, signal.SIGTERM)
        for proc in running:  # one grace for each, as stop_group gives, then SIGKILL
            ended = _wait_group(proc, STOP_GRACE)
            self._reap(proc, signal.SIGTERM if ended else signal.SIGKILL, STOP_GRACE)
        self.stop_superlink()
        if self._own_work and not self.keep:
            shutil.rmtree(self.work, ignore_errors=True)

    def __enter__(self) -> Loopback:
        """Use as `with Loopback() as fed:` so nothing outlives the block."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop everything, also when the block raised."""
        self.close()
