"""MLflow at the edge: one :class:`Tracker` per pipeline run, and nothing else logs.

Tracking must never stop training: every call is guarded, and the first failure (server
unreachable, store broken) is stated once, clearly, after which the tracker goes quiet.
Local reports (``reports/``) and checkpoints do not depend on it, so nothing the run
produced is lost when tracking is down.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, TypeVar

__all__ = [
    "DEFAULT_TRACKING_URI",
    "Tracker",
    "child_run_results",
    "flatten_params",
    "tracking_uri",
]

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
log = logging.getLogger("fedsieve.tracking")
T = TypeVar("T")


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


class Tracker:
    """A guarded MLflow run: ``start`` creates or resumes it, the rest log into it.

    Calls run in order on one background thread: MLflow's import and store set-up (2-3 s
    on a 2-core machine) overlap the data loading and the first round, and no write waits
    for the store. :attr:`run_id`, :attr:`failed`, :meth:`flush` and :meth:`end` wait for
    everything asked before them (the train flow reads ``run_id`` before each checkpoint,
    so a checkpointed round's metrics are always in the store).

    A tracking URI that failed once in this process (or, via ``known_failure``, in an
    earlier stage of the same pipeline run) is not tried again: the failure was stated
    when it happened."""

    _failed_uris: ClassVar[dict[str, str]] = {}

    def __init__(
        self, experiment: str, uri: str | None = None, *, known_failure: str | None = None
    ) -> None:
        self.uri = uri or tracking_uri()
        self.experiment = experiment
        self._run_id: str | None = None
        self._failed: str | None = known_failure or self._failed_uris.get(self.uri)
        self._client: Any = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow-tracker")
        self._pending: list[Future[None]] = []
        self._ended = False

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

    def _active(self) -> bool:
        return self._run_id is not None and self._failed is None

    def _submit(self, what: str, action: Callable[[], Any], *, needs_run: bool = True) -> None:
        """Queue ``action``; it is skipped if, when its turn comes, there is no live run."""

        def carry_out() -> None:
            if not needs_run or self._active():
                self._guard(what, action)

        self._pending.append(self._worker.submit(carry_out))

    def _guard(self, what: str, action: Callable[[], T]) -> T | None:
        if self._failed is not None:
            return None
        try:
            with _quiet_http_retries():
                return action()
        except Exception as error:  # tracking must never stop training
            self._failed = (
                f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            )
            if self._run_id is None:  # the store itself is unreachable: don't try it again
                self._failed_uris[self.uri] = self._failed
            log.warning(
                "MLflow tracking at %s failed while %s (%s); training goes on, reports/ and "
                "checkpoints are still written, and further tracking calls are skipped",
                self.uri,
                what,
                self._failed,
            )
            return None

    def start(self, *, run_id: str | None, run_name: str, tags: Mapping[str, str]) -> None:
        """Resume ``run_id`` when it exists in the store, else create a run (in the
        background: read :attr:`run_id` for the outcome)."""
        tags = dict(tags)

        def _start() -> None:
            import mlflow
            from mlflow import MlflowClient

            mlflow.set_tracking_uri(self.uri)
            self._client = MlflowClient(self.uri)
            if run_id is not None:
                try:
                    self._client.get_run(run_id)
                    self._client.update_run(run_id, status="RUNNING")
                    self._run_id = run_id
                    return
                except Exception:  # not in this store (e.g. another URI): start afresh
                    pass
            experiment = self._client.get_experiment_by_name(self.experiment)
            experiment_id = (
                experiment.experiment_id
                if experiment is not None
                else self._client.create_experiment(self.experiment)
            )
            run = self._client.create_run(experiment_id, run_name=run_name, tags=tags)
            self._run_id = run.info.run_id

        self._submit("starting the run", _start, needs_run=False)

    # MLflow is imported on the tracker's thread only: importing it on two threads at once
    # fails with a partially initialised module.

    def log_params(self, params: Mapping[str, Any]) -> None:
        values = {k: str(v)[:6000] for k, v in params.items()}

        def _log() -> None:
            from mlflow.entities import Param

            items = [Param(k, v) for k, v in values.items()]
            for start in range(0, len(items), 100):
                self._client.log_batch(self._run_id, params=items[start : start + 100])

        self._submit("logging parameters", _log)

    def log_metrics(self, metrics: Mapping[str, float], *, step: int | None = None) -> None:
        now = int(time.time() * 1000)  # when they were measured, not when they are written
        values = {k: float(v) for k, v in metrics.items() if v == v}  # NaN is not logged

        def _log() -> None:
            from mlflow.entities import Metric

            items = [Metric(k, v, now, step or 0) for k, v in values.items()]
            self._client.log_batch(self._run_id, metrics=items)

        self._submit("logging metrics", _log)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        tags = dict(tags)
        self._submit(
            "setting tags",
            lambda: [self._client.set_tag(self._run_id, k, str(v)) for k, v in tags.items()],
        )

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if not Path(path).exists():
            return
        self._submit(
            f"logging {path}",
            lambda: self._client.log_artifact(self._run_id, str(path), artifact_path),
        )

    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None:
        """Rows as an MLflow table (viewable and comparable in the UI's artifact view)."""
        if not rows:
            return

        def _log() -> None:
            import mlflow
            import pandas as pd

            mlflow.set_tracking_uri(self.uri)
            mlflow.log_table(pd.DataFrame(rows), artifact_file=artifact_file, run_id=self._run_id)

        self._submit(f"logging the table {artifact_file}", _log)

    def log_model(self, model: Any, *, input_example: Any, registered_name: str | None) -> None:
        """Log the torch model as ``model`` and register it (when a name is given)."""

        def _log() -> None:
            import mlflow
            import mlflow.pytorch
            import torch

            with mlflow.start_run(run_id=self._run_id):
                mlflow.pytorch.log_model(
                    model,
                    name="model",
                    input_example=input_example,
                    registered_model_name=registered_name,
                    pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
                    await_registration_for=0,
                )

        self._submit("logging the model", _log)

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
        self._submit(
            "closing the run", lambda: self._client.set_terminated(self._run_id, status=status)
        )
        self.flush()
        self._worker.shutdown()
        self._ended = True
