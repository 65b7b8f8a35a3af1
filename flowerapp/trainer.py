"""The site's warm trainer: one long-lived process per site that keeps torch, the engine,
the site's data and its approved plan loaded, and runs each task the site's ClientApp
hands it over a Unix socket inside the site.

Flower 1.32.1 starts a fresh ClientApp process (``flwr-clientapp``) for every message a
SuperNode receives, in both isolation modes, and its public API offers no long-lived
ClientApp (flwrlabs/flower issue 3670 asks for one). So the ClientApp stays thin (Flower and
numpy, no torch) and hands the task to this process; Flower stays the only transport
between hub and site. ``fedsieve-site`` starts the trainer beside its SuperNode and starts
it again when it dies (:class:`KeptTrainer`); a ClientApp that cannot reach it, or whose
trainer dies mid-task, runs the task itself (the cold path, the same code and numbers), so
the round goes on.

The channel: a socket in a directory only the site's user can enter (mode 0700, made by
``fedsieve-site``), with a random key in it (mode 0600) that both ends prove they hold
(:mod:`multiprocessing.connection`'s HMAC challenge) before a task or answer (pickled) is
read. Nothing leaves the host on it.

This module imports no torch: the ClientApp imports it for :func:`ask` (the task and its
answer are :mod:`flowerapp.jobs`' plain values); the serving side imports
:mod:`flowerapp.site_work` when it starts.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import IO

from flowerapp.jobs import Answer, Job
from flowerapp.supernode import stop_with_parent

__all__ = ["KeptTrainer", "TrainerUnavailable", "ask", "prepare_dir", "serve"]

log = logging.getLogger(__name__)
SOCKET = "trainer.sock"
KEY = "trainer.key"
RESTART_AFTER_S = 1.0  # a trainer that died is started again after this pause


class TrainerUnavailable(ConnectionError):
    """No warm trainer answered (none running, or it died mid-task)."""


def prepare_dir(directory: Path) -> None:
    """Make ``directory`` private to this user and give it a fresh key."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    key = directory / KEY
    key.unlink(missing_ok=True)
    descriptor = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(secrets.token_hex(32))


def _key(directory: Path) -> bytes:
    return (directory / KEY).read_text().strip().encode()


def ask(directory: Path, job: Job) -> Answer:
    """The warm trainer's answer to ``job``; :class:`TrainerUnavailable` when none is there
    to answer or it died before it did."""
    try:
        with Client(str(directory / SOCKET), family="AF_UNIX", authkey=_key(directory)) as link:
            link.send(job)
            answer = link.recv()
    except (OSError, EOFError, AuthenticationError) as error:  # none, reset, closed mid-task
        raise TrainerUnavailable(f"{type(error).__name__}: {error}") from None
    if not isinstance(answer, Answer):
        raise TrainerUnavailable(f"the trainer answered a {type(answer).__name__}")
    return answer


def _serve_one(link: Connection) -> None:
    from flowerapp.site_work import run_job

    job = link.recv()
    link.send(run_job(job) if isinstance(job, Job) else Answer(reason="not a job"))


def serve(directory: Path, data: Path | None = None, plan: Path | None = None) -> None:
    """Answer jobs on ``directory``'s socket, one at a time, until stopped. The site's data
    and plan (when given) are loaded before the first job arrives."""
    socket_path = directory / SOCKET
    socket_path.unlink(missing_ok=True)
    with Listener(str(socket_path), family="AF_UNIX", authkey=_key(directory)) as listener:
        from flowerapp.site_work import warm_up

        warm_up(data, plan)
        log.info("warm trainer ready on %s (pid %d)", socket_path, os.getpid())
        while True:
            try:
                with listener.accept() as link:
                    _serve_one(link)
            except (OSError, EOFError, AuthenticationError) as error:  # gone, or a wrong key
                log.warning("a task was not answered: %s: %s", type(error).__name__, error)


SITE_DIED = signal.SIGUSR1  # the trainer's parent-death signal: only the site's death sends it


class SiteDied(BaseException):
    """Raised in the trainer by :data:`SITE_DIED`; a BaseException, as SystemExit is, so the
    serving loop's own error handling lets it through to the directory's removal."""


class KeptTrainer:
    """The warm trainer as a child of ``fedsieve-site``, started again whenever it exits
    until :meth:`stop`; it dies with the site (its parent-death signal)."""

    def __init__(self, command: Sequence[str], env: dict[str, str], out: IO[str]) -> None:
        self.command = list(command)
        self.env = env
        self.out = out
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()
        self.starts = 0
        self._starting = threading.Lock()
        self._watcher = threading.Thread(target=self._keep_running, daemon=True)

    def _say(self, line: str) -> None:
        self.out.write(line + "\n")
        self.out.flush()

    def _start(self) -> subprocess.Popen[bytes]:
        self.starts += 1
        child = subprocess.Popen(
            self.command, env=self.env, stdin=subprocess.DEVNULL,
            preexec_fn=lambda: stop_with_parent(SITE_DIED),
        )  # fmt: skip
        self._say(f"fedsieve-site: warm trainer started (pid {child.pid})")
        return child

    def _keep_running(self) -> None:
        while True:
            with self._starting:  # a stop meanwhile waits for this child, and stops it too
                if self.stopping.is_set():
                    return
                self.child = child = self._start()
            code = child.wait()
            if self.stopping.is_set():
                return
            self._say(
                f"fedsieve-site: warm trainer (pid {child.pid}) exited with {code}; "
                "starting it again (tasks meanwhile run in the ClientApp)"
            )
            self.stopping.wait(RESTART_AFTER_S)

    def start(self) -> KeptTrainer:
        """Start keeping it running (a second call does nothing)."""
        if not self._watcher.is_alive() and not self.stopping.is_set():
            self._watcher.start()
        return self

    def stop(self, grace: float = 5.0) -> None:
        """Stop it and wait for it: nothing it prints comes after this returns."""
        with self._starting:
            self.stopping.set()
            child = self.child
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(grace)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if self._watcher.is_alive():
            self._watcher.join(grace)


def trainer_command(
    directory: Path, data: Path, plan: Path, python: Path | None = None
) -> list[str]:
    """The command ``fedsieve-site`` keeps running: this module in the site's Python
    (``python``, by default the running one)."""
    return [
        str(python or sys.executable), "-m", "flowerapp.trainer", "--dir", str(directory),
        "--data", str(data), "--plan", str(plan),
    ]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flowerapp.trainer", description=__doc__)
    parser.add_argument("--dir", type=Path, required=True, help="the site's private directory")
    parser.add_argument("--data", type=Path, help="the site's data (loaded before any task)")
    parser.add_argument("--plan", type=Path, help="the plan the site approved (loaded too)")
    args = parser.parse_args(argv)
    # its own lines at INFO; the libraries' (torch's statistics at exit) only when they warn
    logging.basicConfig(level=logging.WARNING, format="fedsieve-site trainer: %(message)s")
    log.setLevel(logging.INFO)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # fedsieve-site stops it, quietly

    def site_died(*_: object) -> None:
        raise SiteDied

    signal.signal(SITE_DIED, site_died)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C at the site's terminal: its parent's
    try:
        serve(args.dir, args.data, args.plan)
    except SiteDied:
        # fedsieve-site was killed (SIGKILL) and could not remove the private directory with
        # its key: this process removes it, after the listener has removed its socket
        shutil.rmtree(args.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
