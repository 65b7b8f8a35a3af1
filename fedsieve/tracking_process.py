"""The process that talks to MLflow for every :class:`fedsieve.tracking.Tracker` of one
``fedsieve`` process (started by the first tracker, ended when its parent closes the pipe).

Why a process, not a thread: MLflow's imports and store set-up (3-5 s of pure Python on a
2-core machine) and ``log_model``'s ``torch.export`` (which imports ``torch._dynamo``, about
3 s) held the GIL that the training loop needs, and ``log_model`` ran alone at the end of
the run. Asked to warm up (``warm_up``, which the CLI does first thing, beside Prefect's
server start), this process imports MLflow, opens the store and imports what ``log_model``
needs while the parent imports its own modules: the train and evaluate flows then find
everything ready (measured on 2 cores: train 8.8-9.6 s -> 5.9-7.1 s, evaluate 4.1-5.6 s ->
1.4-1.9 s, start-up +3-4 s; `fedsieve run` median 27.1 s -> 24.9 s). Warming up while
training instead made training twice as slow: its OpenMP threads lose their core.

Protocol (pickles over pipes, one message per request, one answer per request):

- the parent writes ``(seq, tracker_id, op, pickled_args)`` on this process's stdin; the
  first request is ``hello`` with the parent's ``sys.path``, so model classes unpickle here;
- this process answers ``(seq, run_id, failed, failed_here)`` on the file descriptor
  named by its one argument (stdout stays the terminal's: MLflow prints there) after
  carrying out the request, where ``failed`` is the tracker's failure (or ``None``) and
  ``failed_here`` is true on the one answer to the request that failed first (the parent
  states the failure once, naming that request).

Requests of one tracker are carried out in order, on that tracker's own thread here;
trackers are independent (a comparison's cells log at the same time).

Started in one of two ways, the same process afterwards:

- ``python -m fedsieve.tracking_process FD`` (requests on stdin): from any process;
- a fork of the ``fedsieve`` command at its start (:func:`serve_forked`, requests on a
  pipe), once the command has imported torch, which then loads once for both: 1.7 s of
  CPU less in the busiest seconds of a run. On 2 cores, 5 alternating ``fedsieve run``s
  each: forked, the time before the pipeline flow started was shorter in all 5 pairs
  (6.5-9.4 s against 6.8-10.5 s). Only a process with no other thread forks: a fork
  copies one thread, and a lock another one held would stay held.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import pickle
import signal
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO, NoReturn

from fedsieve.startup import collector_paused

__all__ = ["describe", "main", "serve_forked"]


def describe(error: BaseException) -> str:
    """A failure in one line: the error's type and its message's first line."""
    text = str(error)
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


@contextlib.contextmanager
def _quiet_http_retries() -> Iterator[None]:
    """urllib3 warns on every retry; the tracker states a failure itself, once."""
    pool = logging.getLogger("urllib3.connectionpool")
    level = pool.level
    pool.setLevel(logging.ERROR)
    try:
        yield
    finally:
        pool.setLevel(level)


_mlflow_ready = threading.Event()  # set by a warm-up, or at once when there is none
_mlflow_ready.set()
_model_ready = threading.Event()
_model_ready.set()
_warm_up_lock = threading.Lock()


def _warm_up(model: bool) -> None:
    """Import MLflow and its SQL store, then (``model``) what ``mlflow.pytorch.log_model``
    needs beyond MLflow (``torch.export`` imports ``torch._dynamo`` on first use): done while
    the parent imports its own modules and checks its input, so its requests find
    everything ready. Nothing is opened or created: a command whose input is bad leaves no
    store behind. Requests wait for the MLflow part (importing MLflow on two threads at
    once fails); a failure here is left for the request that meets it to state. The
    garbage collector is paused meanwhile, and what was imported frozen after it
    (:mod:`fedsieve.startup`)."""
    with collector_paused(freeze=True):  # the tracking process's own
        _import_for_tracking(model)


def _import_for_tracking(model: bool) -> None:
    try:
        with contextlib.suppress(Exception):
            import mlflow.store.model_registry.sqlalchemy_store
            import mlflow.store.tracking.sqlalchemy_store
            from mlflow import MlflowClient  # noqa: F401
    finally:
        _mlflow_ready.set()
    try:
        if model:
            with contextlib.suppress(Exception):
                import mlflow.pytorch  # noqa: F401
                import torch.export._trace  # noqa: F401

                # MLflow checks a logged model's pip requirements against this
                # environment through a map of every installed distribution's modules,
                # built at its first use: 0.5-1.5 s of the first log_model, at the end
                # of a run, while the other core idles (measured on 2 cores)
                from mlflow.utils import requirements_utils

                requirements_utils._init_packages_to_modules_map()
    finally:
        _model_ready.set()


def _start_warm_up(model: bool) -> None:
    with _warm_up_lock:
        if not (_mlflow_ready.is_set() and _model_ready.is_set()):
            return  # one is under way
        _mlflow_ready.clear()
        _model_ready.clear()
    threading.Thread(target=_warm_up, args=(model,), daemon=True).start()


class _Run:
    """One tracker's MLflow run, as this process sees it."""

    def __init__(self, uri: str, experiment: str, failed: str | None) -> None:
        self.uri = uri
        self.experiment = experiment
        self.run_id: str | None = None
        self.failed = failed
        self.client: Any = None
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow")

    def carry_out(self, op: str, args: dict[str, Any]) -> bool:
        """Run ``op``; True if this is where tracking first failed."""
        needs_run = op != "start"
        _mlflow_ready.wait()
        if op == "log_model":
            _model_ready.wait()
        if self.failed is not None or (needs_run and self.run_id is None):
            return False
        try:
            with _quiet_http_retries():
                getattr(self, f"_{op}")(**args)
        except Exception as error:  # tracking must never stop training
            self.failed = describe(error)
            return True
        return False

    def _start(self, run_id: str | None, run_name: str, tags: dict[str, str]) -> None:
        import mlflow
        from mlflow import MlflowClient

        mlflow.set_tracking_uri(self.uri)
        self.client = MlflowClient(self.uri)
        if run_id is not None:
            try:
                self.client.get_run(run_id)
                self.client.update_run(run_id, status="RUNNING")
                self.run_id = run_id
                return
            except Exception:  # not in this store (e.g. another URI): start afresh
                pass
        experiment = self.client.get_experiment_by_name(self.experiment)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(self.experiment)
        )
        self.run_id = self.client.create_run(
            experiment_id, run_name=run_name, tags=tags
        ).info.run_id

    def _log_params(self, values: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in values.items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    def _log_metrics(self, values: dict[str, float], timestamp: int, step: int) -> None:
        from mlflow.entities import Metric

        items = [Metric(k, v, timestamp, step) for k, v in values.items()]
        self.client.log_batch(self.run_id, metrics=items)

    def _set_tags(self, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, value)

    def _log_artifact(self, path: str, artifact_path: str | None) -> None:
        self.client.log_artifact(self.run_id, path, artifact_path)

    def _log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None:
        import mlflow
        import pandas as pd

        mlflow.set_tracking_uri(self.uri)
        mlflow.log_table(pd.DataFrame(rows), artifact_file=artifact_file, run_id=self.run_id)

    def _log_model(self, model: Any, input_example: Any, registered_name: str | None) -> None:
        import mlflow
        import mlflow.pytorch
        import torch

        mlflow.set_tracking_uri(self.uri)
        with mlflow.start_run(run_id=self.run_id):
            mlflow.pytorch.log_model(
                model,
                name="model",
                input_example=input_example,
                registered_model_name=registered_name,
                pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
                await_registration_for=0,
            )

    def _end(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=status)


def _serve(requests: BinaryIO, answers: BinaryIO) -> None:
    runs: dict[str, _Run] = {}
    ended: list[ThreadPoolExecutor] = []  # closed runs' threads, finishing their last calls
    answer_lock = threading.Lock()

    def answer(
        seq: int, run_id: str | None = None, failed: str | None = None, failed_here: bool = False
    ) -> None:
        with answer_lock:
            pickle.dump((seq, run_id, failed, failed_here), answers, pickle.HIGHEST_PROTOCOL)
            answers.flush()

    def carry_out(seq: int, run: _Run, op: str, args: dict[str, Any]) -> None:
        failed_here = False
        try:
            failed_here = run.carry_out(op, args)
        finally:
            answer(seq, run.run_id, run.failed, failed_here)

    while True:
        try:
            seq, tracker_id, op, payload = pickle.load(requests)
        except EOFError:  # the parent is gone or done: finish what was asked, then end
            break
        args = pickle.loads(payload)
        if op == "hello":
            sys.path[:] = args
            answer(seq)
        elif op == "new":
            runs[tracker_id] = _Run(**args)
            answer(seq, failed=runs[tracker_id].failed)
        elif op == "warm_up":
            _start_warm_up(**args)
            answer(seq)
        elif tracker_id not in runs:  # made in a tracking process that has since died
            answer(seq, None, "the tracking process that held this run is gone", True)
        elif op == "end":  # a tracker's last request: its thread ends after it
            run = runs.pop(tracker_id)
            run.worker.submit(carry_out, seq, run, op, args)
            run.worker.shutdown(wait=False)
            ended.append(run.worker)
        else:
            runs[tracker_id].worker.submit(carry_out, seq, runs[tracker_id], op, args)
    for worker in [run.worker for run in runs.values()] + ended:
        worker.shutdown(wait=True)


def main(answer_fd: int) -> None:
    _serve_until_parent_is_done(sys.stdin.buffer, os.fdopen(answer_fd, "wb"))


def serve_forked(requests_fd: int, answer_fd: int) -> NoReturn:
    """The tracking process in a child just forked from the ``fedsieve`` command: it keeps
    only the terminal and its two pipes (a copy of any other descriptor, a socket or the
    write end of another child's pipe, would keep that open after the parent closes it)
    and never returns into the parent's code."""
    try:
        keep = sorted({0, 1, 2, requests_fd, answer_fd})
        for low, high in itertools.pairwise([*keep, os.sysconf("SC_OPEN_MAX")]):
            os.closerange(low + 1, high)
        _serve_until_parent_is_done(os.fdopen(requests_fd, "rb"), os.fdopen(answer_fd, "wb"))
    finally:
        os._exit(1)  # reached only if serving itself failed


def _serve_until_parent_is_done(requests: BinaryIO, answers: BinaryIO) -> NoReturn:
    # Ctrl-C and a process group's SIGTERM are for the parent, which closes its runs
    # (KILLED) through this process: it must outlive them. It ends at its pipe's end, when
    # the parent exits (or dies: the kernel closes the pipe, even after a SIGKILL).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _serve(requests, answers)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: whoever reads our stderr is not kept waiting


if __name__ == "__main__":
    main(int(sys.argv[1]))
