"""MLflow at the edge: one :class:`Tracker` per pipeline run, and nothing else logs.

Tracking must never stop training: every call is guarded, and the first failure (server
unreachable, store broken, the tracking process gone, a model that cannot be sent to it)
is stated once, clearly, after which the tracker goes quiet. Local reports (``reports/``)
and checkpoints do not depend on it, so nothing the run produced is lost when tracking
is down. MLflow itself runs in :mod:`fedsieve.tracking_process` (why: see there).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, ClassVar

from fedsieve.tracking_process import describe, serve_forked

__all__ = [
    "DEFAULT_TRACKING_URI",
    "Tracker",
    "child_run_results",
    "flatten_params",
    "tracking_uri",
    "warm_up",
]

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
log = logging.getLogger("fedsieve.tracking")


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` when set (a team server works unchanged), else the project's
    SQLite file."""
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def flatten_params(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 0.1}}`` -> ``{"train.lr": 0.1}``; lists become indexed keys."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, f"{name}."))
        elif isinstance(value, list):
            if not value:
                flat[name] = "[]"
            for index, item in enumerate(value):
                if isinstance(item, Mapping):
                    flat.update(flatten_params(item, f"{name}.{index}."))
                else:
                    flat[f"{name}.{index}"] = item
        else:
            flat[name] = value
    return flat


def child_run_results(parent_run_id: str, uri: str | None = None) -> dict[str, dict[str, Any]]:
    """The child runs of ``parent_run_id`` by run name: final metrics (``final_*`` without
    the prefix, as in reports/metrics.json) and the per-round ``test_acc``. How a grid run
    on other machines' workers collects its cells."""
    from mlflow import MlflowClient

    client = MlflowClient(uri or tracking_uri())
    experiment_id = client.get_run(parent_run_id).info.experiment_id
    results: dict[str, dict[str, Any]] = {}
    for run in client.search_runs(
        [experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
        max_results=10_000,
    ):
        history = client.get_metric_history(run.info.run_id, "test_acc")
        results[run.info.run_name] = {
            "metrics": {
                key.removeprefix("final_"): value
                for key, value in run.data.metrics.items()
                if key.startswith("final_")
            },
            "accuracy": [m.value for m in sorted(history, key=lambda m: m.step)],
        }
    return results


class _TrackingProcess:
    """The parent's end of :mod:`fedsieve.tracking_process`: one per process, started by
    the first tracker (or :func:`warm_up`), shared by every tracker after it."""

    _shared: ClassVar[_TrackingProcess | None] = None
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls, *, fork: bool = False) -> _TrackingProcess:
        """The process's tracking process, started now if there is none (``fork``: as a
        fork of this process, if no other thread runs here)."""
        with cls._shared_lock:
            if cls._shared is None or cls._shared.gone is not None:
                cls._shared = cls(fork=fork)
            return cls._shared

    def __init__(self, *, fork: bool = False) -> None:
        # a fork copies only the calling thread: a lock another thread held stays held
        fork = fork and threading.active_count() == 1
        answers_in, answers_out = os.pipe()
        try:
            self._process: subprocess.Popen[bytes] | _ForkedProcess = (
                _ForkedProcess(answers_out)
                if fork
                else subprocess.Popen(
                    [sys.executable, "-m", "fedsieve.tracking_process", str(answers_out)],
                    stdin=subprocess.PIPE,
                    pass_fds=(answers_out,),
                )
            )  # in this session: Linux's autogroup gives a new session as large a CPU share
            # as this whole command, which slowed runs on 2 cores
        finally:
            os.close(answers_out)
        self._answers = os.fdopen(answers_in, "rb")
        self._lock = threading.Lock()
        self._seq = 0
        self._waiting: dict[int, tuple[Tracker | None, str, Future[None]]] = {}
        self.gone: str | None = None
        threading.Thread(target=self._read_answers, name="mlflow-answers", daemon=True).start()
        self.send(None, "hello", [p for p in sys.path if p])

    @property
    def forked(self) -> bool:
        return isinstance(self._process, _ForkedProcess)

    def send(self, tracker: Tracker | None, op: str, args: Any, what: str = "") -> Future[None]:
        """Ask for ``op`` (``what``, in words); the future is done once it has been carried
        out there."""
        # pickled before the lock: a model that cannot be pickled fails here, the pipe intact
        payload = pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL)
        future: Future[None] = Future()
        with self._lock:
            if self.gone is not None:
                raise ConnectionError(self.gone)
            self._seq += 1
            self._waiting[self._seq] = (tracker, what, future)
            request = (self._seq, tracker.id if tracker else "", op, payload)
            try:
                assert self._process.stdin is not None
                pickle.dump(request, self._process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
                self._process.stdin.flush()
            except OSError as error:
                del self._waiting[self._seq]
                raise ConnectionError(f"the tracking process is gone ({error})") from error
        return future

    def _read_answers(self) -> None:
        while True:
            try:
                seq, run_id, failed, failed_here = pickle.load(self._answers)
            except (EOFError, OSError, pickle.UnpicklingError):
                break
            with self._lock:
                tracker, what, future = self._waiting.pop(seq)
            if tracker is not None:
                tracker._answered(run_id, failed, what if failed_here else None)
            future.set_result(None)
        code = self._process.wait()
        with self._lock:
            self.gone = f"the tracking process ended (exit code {code})"
            waiting, self._waiting = self._waiting, {}
        for tracker, what, future in waiting.values():
            if tracker is not None:
                tracker._answered(None, self.gone, what)
            future.set_result(None)


class _ForkedProcess:
    """The tracking process as a child forked from this one (the ``Popen`` parts the
    parent uses: ``pid``, ``stdin``, ``wait``). torch is imported first, so the child has
    it without loading it again."""

    def __init__(self, answers_out: int) -> None:
        import torch  # noqa: F401  (this process needs it too)

        requests_in, requests_out = os.pipe()
        sys.stdout.flush()  # else the child would print the text still buffered here again
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns from here
            serve_forked(requests_in, answers_out)
        os.close(requests_in)
        self.stdin = os.fdopen(requests_out, "wb")

    def wait(self) -> int:
        """Its exit code (negative: the signal that ended it), as ``Popen.wait`` gives."""
        return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])


def warm_up(*, model: bool, fork: bool = False) -> None:
    """Start the tracking process now and have it import MLflow (and, with ``model``, what
    ``log_model`` needs) while this process does other work. ``fork``: start it as a fork
    of this process (the ``fedsieve`` command's own, at its start)."""
    with contextlib.suppress(Exception):  # the first tracker states any failure
        _TrackingProcess.shared(fork=fork).send(None, "warm_up", {"model": model})


class Tracker:
    """A guarded MLflow run: ``start`` creates or resumes it, the rest log into it.

    Calls are carried out in order by the tracking process (:mod:`fedsieve.tracking_process`),
    off this process's GIL: MLflow's import and store set-up overlap the data loading and
    the first round, and no write waits for the store. :attr:`run_id`, :attr:`failed`,
    :meth:`flush` and :meth:`end` wait for everything asked before them (the train flow
    reads ``run_id`` before each checkpoint, so a checkpointed round's metrics are always
    in the store).

    A tracking URI that failed once in this process (or, via ``known_failure``, in an
    earlier stage of the same pipeline run) is not tried again: the failure was stated
    when it happened."""

    _failed_uris: ClassVar[dict[str, str]] = {}

    def __init__(
        self, experiment: str, uri: str | None = None, *, known_failure: str | None = None
    ) -> None:
        self.uri = uri or tracking_uri()
        self.experiment = experiment
        self.id = uuid.uuid4().hex
        self._run_id: str | None = None
        self._failed: str | None = known_failure or self._failed_uris.get(self.uri)
        self._pending: list[Future[None]] = []
        self._ended = False
        self._state_lock = threading.Lock()
        self._request(
            "starting the tracker", "new", uri=self.uri, experiment=experiment, failed=self._failed
        )

    @property
    def run_id(self) -> str | None:
        self.flush()
        return self._run_id

    @property
    def failed(self) -> str | None:
        self.flush()
        return self._failed

    def flush(self) -> None:
        """Wait until every call made so far has been carried out (or has failed)."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def _request(self, what: str, op: str, /, **args: Any) -> None:
        """Ask the tracking process for ``op``; nothing is asked once tracking has failed
        or the run was closed (there, a call is also skipped when its turn comes and there
        is no live run)."""
        if self._failed is not None or self._ended:
            return
        try:
            self._pending.append(_TrackingProcess.shared().send(self, op, args, what))
        except Exception as error:  # a model that cannot be pickled, a process that died
            self._answered(self._run_id, describe(error), what)

    def _answered(self, run_id: str | None, failed: str | None, failed_while: str | None) -> None:
        """The tracking process's state of this run after a request (from its answer
        thread, or from the caller's when a request could not be sent: hence the lock)."""
        with self._state_lock:
            if run_id is not None:
                self._run_id = run_id
            if failed is None or self._failed is not None:
                return
            self._failed = failed
            if self._run_id is None:  # the store itself is unreachable: don't try it again
                self._failed_uris[self.uri] = failed
        if failed_while is not None:
            log.warning(
                "MLflow tracking at %s failed while %s (%s); training goes on, reports/ and "
                "checkpoints are still written, and further tracking calls are skipped",
                self.uri,
                failed_while,
                failed,
            )

    def start(self, *, run_id: str | None, run_name: str, tags: Mapping[str, str]) -> None:
        """Resume ``run_id`` when it exists in the store, else create a run (in the
        background: read :attr:`run_id` for the outcome)."""
        self._request(
            "starting the run", "start", run_id=run_id, run_name=run_name, tags=dict(tags)
        )

    def log_params(self, params: Mapping[str, Any]) -> None:
        values = {k: str(v)[:6000] for k, v in params.items()}
        self._request("logging parameters", "log_params", values=values)

    def log_metrics(self, metrics: Mapping[str, float], *, step: int | None = None) -> None:
        now = int(time.time() * 1000)  # when they were measured, not when they are written
        values = {k: float(v) for k, v in metrics.items() if v == v}  # NaN is not logged
        self._request(
            "logging metrics", "log_metrics", values=values, timestamp=now, step=step or 0
        )

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._request("setting tags", "set_tags", tags={k: str(v) for k, v in tags.items()})

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if not Path(path).exists():
            return
        self._request(
            f"logging {path}", "log_artifact", path=str(path), artifact_path=artifact_path
        )

    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None:
        """Rows as an MLflow table (viewable and comparable in the UI's artifact view)."""
        if not rows:
            return
        self._request(
            f"logging the table {artifact_file}",
            "log_table",
            rows=rows,
            artifact_file=artifact_file,
        )

    def log_model(self, model: Any, *, input_example: Any, registered_name: str | None) -> None:
        """Log the torch model as ``model`` and register it (when a name is given). The
        model is pickled here, so later changes to it do not reach the logged one."""
        self._request(
            "logging the model",
            "log_model",
            model=model,
            input_example=input_example,
            registered_name=registered_name,
        )

    @contextlib.contextmanager
    def ended_on_failure(self) -> Iterator[None]:
        """Close the run as FAILED (an error) or KILLED (a signal: Ctrl-C, or SIGTERM from a
        worker or ``kill``, which Prefect raises as its own ``TerminationSignal``) should
        the block raise, after logging what was asked before, so the UI does not show a
        dead run as still running. ``--resume`` reopens it."""
        try:
            yield
        except Exception:
            self.end("FAILED")
            raise
        except BaseException:
            self.end("KILLED")
            raise

    def end(self, status: str = "FINISHED") -> None:
        """Close the run, waiting for every call before it (once: later calls do nothing)."""
        if self._ended:
            return
        self._request("closing the run", "end", status=status)
        self.flush()
        self._ended = True
