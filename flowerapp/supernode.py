"""``fedsieve-site``'s SuperNode, watched: refusals in one line, restarts that rejoin.

``flower-supernode`` 1.32.1 ends with exit code 1 and a traceback whenever the SuperLink
refuses it: its key is not registered ("No SuperNode found with the given public key"),
the hub's certificate is not one ``--ca`` vouches for (a TLS handshake failure), or its
node is still online ("SuperNode with node ID N could not be activated"). The last is
what a site restarted soon after a crash meets: the SuperLink counts a node online until
its heartbeat lapses (two 30-second intervals), and only then lets the same key join
again. Flower retries none of these (``flwr.supercore.retry``: only an unreachable hub
is retried), and says which it was only in its log.

So the site command runs ``flower-supernode`` as its child and reads what it prints. A
node still online is waited for: the child is started again every few seconds, with one
line saying so, until the hub lets the node in (or ``rejoin_timeout`` says another
SuperNode is using the key). Every other refusal ends the site with one line and its own
exit code (:data:`EXIT_CODES`), Flower's report of it held back. Once the node has
joined, everything Flower prints is passed through as it comes. SIGTERM (``docker
stop``, ``systemctl stop``) is passed to the child, which deactivates its node; Ctrl-C
reaches both, as they share a process group.
"""

from __future__ import annotations

import contextlib
import ctypes
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

from flowerapp.timing import PROCESS_STARTED, since

__all__ = [
    "EXIT_CODES",
    "EXIT_KEY_IN_USE",
    "EXIT_KEY_REFUSED",
    "EXIT_STOPPED",
    "EXIT_SUPERNODE",
    "EXIT_TLS",
    "EXIT_USAGE",
    "Site",
    "run_supernode",
    "stop_with_parent",
]

PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def stop_with_parent(signum: int = signal.SIGTERM) -> None:
    """In a child of ``fedsieve-site``, before it execs: ``signum`` when the site dies,
    even by SIGKILL, so no SuperNode outlives its site process and holds its port and
    node (the SuperNode deactivates its node on SIGTERM, as on a stop)."""
    if LIBC is not None:
        LIBC.prctl(PR_SET_PDEATHSIG, signum)


EXIT_STOPPED = 0  # stopped by SIGTERM or Ctrl-C
EXIT_USAGE = 2  # a data file, plan, key, certificate or port the site cannot use
EXIT_KEY_REFUSED = 3  # the hub does not know this site's key (never registered, or revoked)
EXIT_TLS = 4  # the hub's certificate is not signed by --ca, or not for this host name
EXIT_KEY_IN_USE = 5  # the node stayed online past the rejoin timeout: the key is in use
EXIT_SUPERNODE = 6  # flower-supernode ended otherwise before joining (its last error)
EXIT_CODES = {
    EXIT_STOPPED: "stopped (SIGTERM, Ctrl-C)",
    EXIT_USAGE: "a data file, plan, key, certificate or port the site cannot use",
    EXIT_KEY_REFUSED: "the hub does not know this site's key: not registered, or revoked",
    EXIT_TLS: "the hub's certificate is not signed by --ca or not for its host name",
    EXIT_KEY_IN_USE: "another SuperNode is online with this site's key",
    EXIT_SUPERNODE: "flower-supernode failed before joining (its last error quoted)",
}

RETRY_S = 2.0  # between tries while the old node is still online (a try takes seconds more)
STOP_GRACE = 10.0  # after Ctrl-C or a revoked key: SIGTERM, then SIGKILL this much later
QUIET_S = 0.2  # how long the output must be quiet before an exited child is done with
HOLD_S = 10.0  # a child not joined by then is waiting on the hub: its lines are shown as they come
TRACEBACK_QUIET_S = 10.0  # a held traceback without a new line this long is shown

_JOINED = re.compile(r"SuperNode ID: (\d+)")
_STILL_ONLINE = re.compile(r"SuperNode with node ID (\d+) could not be activated")
_UNKNOWN_KEY = "No SuperNode found with the given public key"
_REVOKED = 'details = "Invalid node ID"'  # a joined node's key was unregistered
_HANDSHAKE = re.compile(r"handshake failed", re.IGNORECASE)
_VERIFY = re.compile(r"CERTIFICATE_VERIFY_FAILED: ([^:\n]+)")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_TRACEBACK = "Traceback (most recent call last):"
_LOG_LINE = re.compile(r"^(\x1b\[[0-9;]*m)?(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")


@dataclass(frozen=True)
class Site:
    """What the refusal messages name: the hub's address and the site's files."""

    superlink: str
    ca: Path
    key: Path


@dataclass
class _Attempt:
    """One run of flower-supernode: what it printed before joining, its node once in.
    ``held`` keeps every line before the join, for reading a refusal; ``passing`` is set
    once they are shown as they come (an attempt that waits on the hub past HOLD_S)."""

    number: int
    started: float = field(default_factory=time.monotonic)
    held: list[str] = field(default_factory=list)
    passing: bool = False
    node: int | None = None
    revoked: bool = False
    refused_at: float | None = None  # when the hub's refusal was read (the child should end)
    traceback: list[str] = field(default_factory=list)  # held once joined, until it is read
    traceback_at: float = 0.0  # when its last line came
    returncode: int = 0


def _refused(line: str) -> bool:
    """Whether ``line`` is the hub's refusal of the node: an unknown key, a node still
    online, a failed TLS handshake."""
    return _UNKNOWN_KEY in line or bool(_STILL_ONLINE.search(line) or _HANDSHAKE.search(line))


def _plain(line: str) -> str:
    return _COLOUR.sub("", line).strip()


def _refusal(attempt: _Attempt, site: Site) -> tuple[int, str]:
    """The exit code and one line for a child that ended before joining."""
    text = "".join(attempt.held)
    if _UNKNOWN_KEY in text:
        return EXIT_KEY_REFUSED, (
            f"the hub {site.superlink} does not know this site's key {site.key}: send its "
            "public key to the hub operator to register (flwr supernode register), or ask "
            "whether it was revoked"
        )
    if _HANDSHAKE.search(text):
        verify = _VERIFY.search(text)
        why = f" ({verify.group(1).strip()})" if verify else ""
        return EXIT_TLS, (
            f"TLS to {site.superlink} failed{why}: the hub's certificate is not signed by "
            f"--ca {site.ca}, or not issued for the host name {site.superlink.rsplit(':', 1)[0]}"
        )
    plain = [text for line in attempt.held if (text := _plain(line))]
    details = [text for text in plain if text.startswith("details = ")]
    errors = [text for text in plain if text.startswith("ERROR")]
    last = (details or errors or plain or ["no output"])[-1]
    return EXIT_SUPERNODE, (
        f"flower-supernode exited with {attempt.returncode} before joining: {last[:300]}"
    )


class _Supervisor:
    """Runs flower-supernode until it joins and ends, retrying while the node is online."""

    def __init__(
        self, command: Sequence[str], env: dict[str, str], out: IO[str],
        on_joined: Callable[[], object] | None = None, process_started: float | None = None,
    ) -> None:  # fmt: skip
        self.command = list(command)
        self.env = env
        self.out = out
        self.on_joined = on_joined
        self.child: subprocess.Popen[str] | None = None
        self.stopping = threading.Event()
        self.stop_at: float | None = None
        # the rejoin line's clock: the site's process start (a Unix time), not this point,
        # which comes after the site read and checked its data
        self.process_started = time.time() if process_started is None else process_started
        self.waiting_since: float | None = None

    def say(self, line: str) -> None:
        self.out.write(line if line.endswith("\n") else line + "\n")
        self.out.flush()

    # -- signals ---------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        """SIGTERM goes to the child; Ctrl-C reached it already (one process group)."""
        self.stopping.set()
        self.stop_at = self.stop_at or time.monotonic()
        child = self.child
        if signum == signal.SIGTERM and child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    @contextlib.contextmanager
    def signals(self) -> Iterator[None]:
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    # -- one run of the child --------------------------------------------------------------

    def _show_held(self, attempt: _Attempt) -> None:
        """The start-up lines held so far, the first attempt's only (a later try's repeat
        them), from here on shown as they come."""
        if attempt.number == 1 and not attempt.passing:
            for held in attempt.held:
                self.say(held)
        attempt.passing = True

    def _line(self, attempt: _Attempt, line: str) -> None:
        """Hold what comes before the node joins; pass the rest through. A WARNING does not
        end the holding: the SuperExec that flower-supernode starts before it connects
        shares its output and warns when the SuperNode it serves is refused and gone."""
        if attempt.node is None:
            joined = _JOINED.search(line)
            if joined is None:
                attempt.held.append(line)  # start-up lines, or the report of a refusal
                if attempt.refused_at is None and _refused(line):
                    attempt.refused_at = time.monotonic()
                if attempt.passing:
                    self.say(line)
                return
            self._show_held(attempt)
            attempt.node = int(joined.group(1))
            self.say(line)
            if self.on_joined is not None:
                self.on_joined()
            if self.waiting_since is not None:
                self.say(
                    f"fedsieve-site: rejoined as node {attempt.node}, "
                    f"{since(self.process_started):.0f} s after this site's process started"
                )
            return
        self._joined_line(attempt, line)

    def _joined_line(self, attempt: _Attempt, line: str) -> None:
        """Pass a joined node's lines through, but hold a traceback until it is read: the
        one flower-supernode prints when the hub unregistered its key says so only midway
        (:data:`_REVOKED`), and is then left out for the site's one line. A log line does
        not end a held traceback: the SuperExec shares the output and, started late on a
        busy machine, logs in the middle of one. A chained traceback is held whole. It is
        shown once it has had no line for TRACEBACK_QUIET_S, or when the child ends."""
        if attempt.revoked:
            return
        if _REVOKED in line:
            attempt.revoked = True
            attempt.traceback.clear()
            self.stop_at = time.monotonic() - STOP_GRACE  # stop it now
            return
        held = attempt.traceback or line.startswith(_TRACEBACK)
        if not held or _LOG_LINE.match(line):
            self.say(line)
            return
        attempt.traceback.append(line)
        attempt.traceback_at = time.monotonic()

    def _release_quiet_traceback(self, attempt: _Attempt) -> None:
        """A held traceback that had no new line for TRACEBACK_QUIET_S was no revocation."""
        if attempt.traceback and time.monotonic() - attempt.traceback_at >= TRACEBACK_QUIET_S:
            self._release_traceback(attempt)

    def _release_traceback(self, attempt: _Attempt) -> None:
        for held in attempt.traceback:
            self.say(held)
        attempt.traceback.clear()

    def _escalate(self, child: subprocess.Popen[str], attempt: _Attempt) -> None:
        """A child asked to stop (Ctrl-C, a revoked key), or refused by the hub and still
        there STOP_GRACE later, gets SIGTERM, then SIGKILL: flower-supernode 1.32.1 has
        been seen to hang on its way out after a refusal (once on a loaded CI machine)."""
        asked = self.stop_at if self.stop_at is not None else attempt.refused_at
        if asked is None or child.poll() is not None:
            return
        late = time.monotonic() - asked
        if late >= 2 * STOP_GRACE:
            child.kill()
        elif late >= STOP_GRACE:
            child.terminate()

    def attempt(self, number: int) -> _Attempt:
        attempt = _Attempt(number)
        self.child = child = subprocess.Popen(
            self.command, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1,
            preexec_fn=stop_with_parent,
        )  # fmt: skip
        lines: queue.Queue[str | None] = queue.Queue()
        assert child.stdout is not None
        threading.Thread(target=_pump, args=(child.stdout, lines), daemon=True).start()
        while True:
            try:
                line = lines.get(timeout=QUIET_S)
            except queue.Empty:
                if child.poll() is not None:
                    break  # exited, and its output (a grandchild may hold the pipe) quiet
                self._escalate(child, attempt)
            else:
                if line is None:
                    break
                self._line(attempt, line)
            if attempt.node is None and time.monotonic() - attempt.started > HOLD_S:
                self._show_held(attempt)  # still not in: the hub is slow or away, say so
            self._release_quiet_traceback(attempt)
        attempt.returncode = child.wait()
        self._release_traceback(attempt)
        return attempt

    # -- the whole run ---------------------------------------------------------------------

    def run(self, site: Site, rejoin_timeout: float) -> tuple[int, str | None]:
        """The site's exit code, and its last line when it ends on an error (said by the
        caller once all the site started has ended, so that it is the last line)."""
        number = 0
        while True:
            number += 1
            attempt = self.attempt(number)
            if self.stopping.is_set():
                return EXIT_STOPPED, None
            if attempt.revoked:
                return EXIT_KEY_REFUSED, (
                    f"the hub {site.superlink} no longer accepts this site's key {site.key} "
                    f"(node {attempt.node} was unregistered)"
                )
            if attempt.node is not None:
                return attempt.returncode, None
            online = _STILL_ONLINE.search("".join(attempt.held))
            if online is None:
                return _refusal(attempt, site)
            if self.waiting_since is None:
                self.waiting_since = time.monotonic()
                self.say(
                    f"fedsieve-site: the hub still counts this site's previous SuperNode "
                    f"(node {online.group(1)}) online; waiting until its heartbeat lapses "
                    f"(at most {rejoin_timeout:.0f} s), then rejoining"
                )
            elif time.monotonic() - self.waiting_since > rejoin_timeout:
                return EXIT_KEY_IN_USE, (
                    f"node {online.group(1)} is still online after {rejoin_timeout:.0f} s: "
                    f"another SuperNode runs with this site's key {site.key}; stop it, or wait "
                    "and start this one again"
                )
            if self.stopping.wait(RETRY_S):
                return EXIT_STOPPED, None


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    """The child's output, line by line, then None at its end."""
    for line in stream:
        lines.put(line)
    lines.put(None)


def run_supernode(
    command: Sequence[str],
    env: dict[str, str],
    site: Site,
    *,
    rejoin_timeout: float = 120.0,
    out: IO[str] | None = None,
    on_joined: Callable[[], object] | None = None,
    on_ended: Callable[[], object] | None = None,
    process_started: float | None = PROCESS_STARTED,
) -> int:
    """Run ``command`` (flower-supernode) until it ends; ``fedsieve-site``'s exit code.
    ``on_joined`` is called whenever the hub has let the node in, ``on_ended`` once the
    SuperNode has ended, before the site's last line (what it started is stopped first).
    ``process_started`` (a Unix time; default: this process's start) is when the rejoin
    line's clock starts."""
    supervisor = _Supervisor(command, env, out or sys.stderr, on_joined, process_started)
    with supervisor.signals():
        code, why = supervisor.run(site, rejoin_timeout)
        if on_ended is not None:
            on_ended()
    if why is not None:
        supervisor.say(f"fedsieve-site: error: {why}")
    return code
