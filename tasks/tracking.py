"""MLflow at the edge: one :class:`Tracker` per pipeline run, and nothing else logs.

Tracking must never stop training: every call is guarded, and the first failure (server
unreachable, store broken, a model that cannot be logged) is stated once, clearly, after
which the tracker goes quiet. Local reports (``reports/``) and checkpoints do not depend
on it, so nothing the run produced is lost when tracking is down. MLflow is used through
its public client (``MlflowClient``), in this process; a call made on the main thread runs
on a thread of its own, so that a Ctrl-C or SIGTERM never cuts the store's code short
(:func:`unsignalled`).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from prefect import task
from prefect.cache_policies import NO_CACHE

from config.dataset import dataset_info_of
from config.environment import DEFAULT_TRACKING_URI, tracking_uri
from config.params import Params, params_hash, privacy_unaccounted
from federated.data import DatasetInfo
from tasks.reports import ProjectPaths

__all__ = [
    "DEFAULT_TRACKING_URI",
    "Tracker",
    "child_run_results",
    "describe",
    "flatten_params",
    "fluent_tracking_at",
    "git_commit",
    "model_requirements",
    "open_training_run",
    "run_tags",
    "tracking_uri",
    "unsignalled",
]

PARAMS_PER_BATCH = 100  # MLflow's limits on one log_batch call
METRICS_PER_BATCH = 1000
log = logging.getLogger("fedsieve.tracking")
ROUND_KEY = "clients_sampled"  # a metric every round's report holds
# the file MLflow logs as the pyfunc model's code (models-from-code): no pickled object
MODEL_CODE = str(Path(__file__).with_name("served_model_code.py"))
T = TypeVar("T")


def describe(error: BaseException) -> str:
    """A failure in one line: the error's type and its message's first line."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


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
    on other machines' workers collects its cells (read beside signals: the parent's
    close follows should a stop land here)."""
    return unsignalled(lambda: _child_run_results(parent_run_id, uri or tracking_uri()))


def _child_run_results(parent_run_id: str, uri: str) -> dict[str, dict[str, Any]]:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
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


@contextlib.contextmanager
def fluent_tracking_at(uri: str) -> Iterator[None]:
    """MLflow's fluent API (the one ``log_model`` uses) pointed at ``uri`` for the block
    only. ``mlflow.set_tracking_uri`` also writes ``MLFLOW_TRACKING_URI`` into the process
    environment, which every later child process (a ``flwr``, a DVC stage, another run)
    would inherit. Afterwards the fluent URI is unset (fedsieve itself only uses clients
    given their URI) and the environment is as it was, so the fluent API follows
    ``MLFLOW_TRACKING_URI`` again."""
    import mlflow

    variable = "MLFLOW_TRACKING_URI"
    environment_before = os.environ.get(variable)
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(None)  # type: ignore[arg-type]  # unsets it (and the variable)
        if environment_before is not None:
            os.environ[variable] = environment_before


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


def unsignalled(action: Callable[[], T], one_at_a_time: threading.Lock | None = None) -> T:
    """``action()`` (a call to the store) on a thread of its own, waited for here.

    Python runs signal handlers on the main thread only, between any two bytecodes, so a
    Ctrl-C or SIGTERM that lands inside a store call raises in the store's own code, past
    its cleanup (SQLAlchemy's handles ``Exception``, not ``KeyboardInterrupt``): a SELECT
    left unread keeps its SQLite cursor open, that cursor holds the database's lock for
    as long as the stop's traceback lives, and the run's close, made while the stop is
    handled, fails behind it. Here the stop interrupts only the wait; the call finishes
    cleanly on its thread (a daemon: it never holds the process at its exit), in the
    caller's context. Called off the main thread, where no signal lands, ``action`` runs
    in place.
    ``one_at_a_time``: held while the call runs, so that a later call (the close) waits
    for one a stop interrupted."""
    if threading.current_thread() is not threading.main_thread():
        return action()
    outcome: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
    context = contextvars.copy_context()

    def call() -> None:
        with one_at_a_time or contextlib.nullcontext():
            try:
                outcome.put((True, context.run(action)))
            except BaseException as error:  # handed to the caller, as if raised there
                outcome.put((False, error))

    threading.Thread(target=call, name="fedsieve-tracking", daemon=True).start()
    done, value = outcome.get()  # a stop lands here (a C-level wait), not in the store
    if not done:
        raise value
    return value


def artifacts_beside(uri: str) -> str | None:
    """For a SQLite store, its ``mlruns`` folder beside the database file (so one folder or
    volume keeps the whole store; for ``sqlite:///mlflow.db`` that is MLflow's own default,
    ``./mlruns``); for any other store, the store's default (None)."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlruns").as_uri()


class Tracker:
    """A guarded MLflow run: :meth:`start` creates or resumes it, the rest log into it.

    A tracking URI that failed once in this process (or, via ``known_failure``, in an
    earlier stage of the same pipeline run) is not tried again: the failure was stated
    when it happened."""

    _failed_uris: ClassVar[dict[str, str]] = {}

    def __init__(
        self, experiment: str, uri: str | None = None, *, known_failure: str | None = None
    ) -> None:
        self.uri = uri or tracking_uri()
        self.experiment = experiment
        self.run_id: str | None = None
        self.tags: dict[str, str] = {}
        self.failed: str | None = known_failure or self._failed_uris.get(self.uri)
        self._ended = False
        self._client: Any = None
        self._one_call = threading.Lock()  # see `unsignalled`

    def _guarded(self, what: str, action: Callable[[], T], *, needs_run: bool = True) -> T | None:
        """``action()``, unless tracking failed, the run is closed or (``needs_run``) there
        is none; its first failure is stated once and turns the tracker off."""
        if self.failed is not None or self._ended or (needs_run and self.run_id is None):
            return None

        def quietly() -> T:
            with _quiet_http_retries():
                return action()

        try:
            return unsignalled(quietly, self._one_call)
        except Exception as error:  # tracking must never stop training
            self.failed = describe(error)
            if self.run_id is None:  # the store itself is unusable: don't try it again
                self._failed_uris[self.uri] = self.failed
            log.warning(
                "MLflow tracking at %s failed while %s (%s); training goes on, reports/ and "
                "checkpoints are still written, and further tracking calls are skipped",
                self.uri,
                what,
                self.failed,
            )
            return None

    def start(self, *, run_id: str | None, run_name: str, tags: Mapping[str, str]) -> None:
        """Resume ``run_id`` when it exists in the store, else create a run. A run to
        resume whose store does not answer is still this tracker's run: what it should
        hold is owed to it (:meth:`retried`), not forgotten as if it were never tracked."""
        self._guarded(
            "starting the run", lambda: self._start(run_id, run_name, tags), needs_run=False
        )
        if self.run_id is None and run_id is not None and self.failed is not None:
            self.run_id = run_id

    def _connect(self) -> None:
        from mlflow import MlflowClient

        self._client = MlflowClient(self.uri)

    def _start(self, run_id: str | None, run_name: str, tags: Mapping[str, str]) -> None:
        from mlflow.exceptions import MlflowException

        self._connect()
        if run_id is not None:
            try:
                self._client.get_run(run_id)
            except MlflowException as error:
                # only a store that answers "no such run" (e.g. another URI) starts afresh;
                # one that did not answer still owes this run its record
                if error.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
            else:
                self._client.update_run(run_id, status="RUNNING")
                self.run_id = run_id
                return
        experiment = self._client.get_experiment_by_name(self.experiment)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self._client.create_experiment(
                self.experiment,
                artifact_location=artifacts_beside(self.uri),
                # MLflow 3 opens an experiment on GenAI traces unless told it holds models
                tags={"mlflow.experimentKind": "custom_model_development"},
            )
        )
        run = self._client.create_run(experiment_id, run_name=run_name, tags=dict(tags))
        self.run_id = run.info.run_id

    def log_dataset(self, name: str, digest: str, source: str, context: str) -> None:
        """An MLflow dataset input of the run (``context``: what the run used it for), so
        the UI shows which data, by its digest, each run trained on."""

        def log() -> None:
            from mlflow.entities import Dataset, DatasetInput, InputTag

            dataset = Dataset(
                name=name, digest=digest, source_type="local", source=json.dumps({"uri": source})
            )
            tags = [InputTag(key="mlflow.data.context", value=context)]
            self._client.log_inputs(self.run_id, datasets=[DatasetInput(dataset, tags)])

        self._guarded(f"logging the dataset {name}", log)

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for start in range(0, len(items), PARAMS_PER_BATCH):
            batch = items[start : start + PARAMS_PER_BATCH]
            self._guarded(
                "logging parameters", lambda b=batch: self._client.log_batch(self.run_id, params=b)
            )

    def log_metrics(self, metrics: Mapping[str, float], *, step: int | None = None) -> None:
        """Finite values only (NaN, e.g. an AUC with one class present, is not logged)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step or 0) for k, v in metrics.items() if v == v]
        self._guarded("logging metrics", lambda: self._client.log_batch(self.run_id, metrics=items))

    def log_history(self, rows: Sequence[Mapping[str, float]], *, step_key: str = "round") -> None:
        """Many steps' metrics at once (each row logged at ``row[step_key]``), in batches
        of MLflow's limit: how a comparison cell logs its rounds when it ends."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [
            Metric(k, float(v), now, int(row[step_key]))
            for row in rows
            for k, v in row.items()
            if k != step_key and v == v
        ]
        for start in range(0, len(items), METRICS_PER_BATCH):
            batch = items[start : start + METRICS_PER_BATCH]
            self._guarded(
                "logging metrics", lambda b=batch: self._client.log_batch(self.run_id, metrics=b)
            )

    def log_missing_rounds(self, history: Sequence[Mapping[str, float]]) -> list[int]:
        """The rounds of ``history`` the run does not hold (their tracking failed, say
        through a database outage longer than the client's retries), logged now; which.
        A round is held when its ``ROUND_KEY`` (logged every round) is."""
        logged = self._guarded(
            "reading the rounds the run holds",
            lambda: {m.step for m in self._client.get_metric_history(self.run_id, ROUND_KEY)},
        )
        if logged is None:
            return []
        missing = [row for row in history if int(row["round"]) not in logged]
        self.log_history(missing)
        return [int(row["round"]) for row in missing]

    def recovered(self, history: Sequence[Mapping[str, float]]) -> bool:
        """Whether the run's tracking holds every round of ``history`` (see :meth:`retried`):
        when the store answers again, the rounds it lost are logged now and tracking
        resumes."""
        return self.retried(
            "the rounds it lost (from the run's history)", lambda: self.log_missing_rounds(history)
        )

    def retried(self, what: str, record: Callable[[], object]) -> bool:
        """Whether the run's tracking holds ``what``: true unless tracking failed after
        the run was opened and ``record`` (which logs all of ``what``), tried once more,
        fails again. (A run whose store never answered was never tracked: true.)"""
        if self.failed is None or self.run_id is None:
            return True
        lost_at = self.failed
        self.failed = None  # one more try
        if self._client is None:  # the store did not answer when the run was reopened
            self._guarded("reconnecting", self._connect, needs_run=False)
        if self.failed is None:
            record()
        if self.failed is not None:
            return False
        self._failed_uris.pop(self.uri, None)
        log.warning(
            "MLflow tracking at %s is back (it failed: %s); %s logged again",
            self.uri,
            lost_at,
            what,
        )
        return True

    def set_tags(self, tags: Mapping[str, str]) -> None:
        for key, value in tags.items():
            self._guarded(
                "setting tags", lambda k=key, v=value: self._client.set_tag(self.run_id, k, str(v))
            )

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if Path(path).exists():
            self._guarded(
                f"logging {path}",
                lambda: self._client.log_artifact(self.run_id, str(path), artifact_path),
            )

    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None:
        """Rows as an MLflow table (viewable and comparable in the UI's artifact view)."""
        if rows:
            self._guarded(
                f"logging the table {artifact_file}",
                lambda: self._client.log_table(self.run_id, _frame(rows), artifact_file),
            )

    def log_model(
        self, classifier: Path, info: DatasetInfo, *, registered_name: str | None
    ) -> str | None:
        """Log the classifier folder as the run's pyfunc ``model`` (image files in, class
        probabilities out: :mod:`tasks.served_model`) and register it when a name is
        given; the registered version (None: not registered)."""
        return self._guarded(
            "logging the model", lambda: self._log_model(classifier, info, registered_name)
        )

    def _log_model(
        self, classifier: Path, info: DatasetInfo, registered_name: str | None
    ) -> str | None:
        import mlflow
        import mlflow.pyfunc

        from tasks.served_model import CLASSIFIER_ARTIFACT, input_example, signature

        earlier = registered_name is not None and self._client.search_model_versions(
            f"name='{registered_name}' and run_id='{self.run_id}'"
        )
        if earlier and _takes_image_files(
            self.uri, f"models:/{registered_name}/{earlier[0].version}"
        ):
            return str(earlier[0].version)  # registered by an earlier try of this run
        with fluent_tracking_at(self.uri), mlflow.start_run(run_id=self.run_id):
            logged = mlflow.pyfunc.log_model(
                name="model",
                python_model=MODEL_CODE,  # models-from-code: loading unpickles nothing
                artifacts={CLASSIFIER_ARTIFACT: str(classifier)},
                signature=signature(info),
                input_example=input_example(info),
                registered_model_name=registered_name,
                pip_requirements=model_requirements(),  # inferring them runs a subprocess
                await_registration_for=0,
            )
        version = logged.registered_model_version
        return None if version is None else str(version)

    @contextlib.contextmanager
    def ended_on_failure(self) -> Iterator[None]:
        """Close the run as FAILED (an error) or KILLED (a signal: Ctrl-C, or SIGTERM from a
        worker or ``kill``) should the block raise, so the UI does not show a dead run as
        still running. ``--resume`` reopens it."""
        try:
            yield
        except BaseException as error:
            self.end("KILLED" if stopped_by_signal(error) else "FAILED")
            raise

    def end(self, status: str = "FINISHED") -> None:
        """Close the run (once: later calls do nothing). The close is tried even after an
        earlier call failed (an outage): it is the one call that keeps a dead run from
        showing RUNNING, and the store may answer again."""
        earlier = self.failed
        if earlier is not None and self.run_id is not None and not self._ended:
            self.failed = None  # one more try, for the close
        self._guarded(
            "closing the run", lambda: self._client.set_terminated(self.run_id, status=status)
        )
        self.failed = earlier or self.failed  # the first failure stays on record
        self._ended = True


def stopped_by_signal(error: BaseException) -> bool:
    """Whether ``error`` is, or was raised while handling, a stop rather than an error:
    Ctrl-C, SIGTERM (``SystemExit``, Prefect's ``TerminationSignal``) or a cancelled grid.
    Prefect reports a signalled task to its server before re-raising; should that report
    fail, the error it raises carries the signal as its context."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if not isinstance(current, Exception):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _frame(rows: list[dict[str, Any]]) -> Any:
    import pandas as pd

    return pd.DataFrame(rows)


def git_commit(workdir: Path) -> str:
    """The checkout's commit, or ``unknown`` outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=workdir, capture_output=True, text=True, timeout=10
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def privacy_tags(params: Params) -> dict[str, str]:
    """Under DP: the mode and whether the logged ε holds for this run's rules."""
    if params.privacy.mode == "off":
        return {"privacy": "off"}
    holds = not privacy_unaccounted(params)
    return {"privacy": params.privacy.mode, "privacy_epsilon_holds": str(holds).lower()}


def run_tags(params: Params, workdir: Path) -> dict[str, str]:
    """The tags every pipeline run carries (what ``fedsieve runs`` and the UI filter on)."""
    attack = params.attack
    if attack.name == "none":
        fraction = "0"
    elif attack.ids is not None:
        fraction = str(len(attack.ids) / params.partition.num_clients)
    else:
        fraction = str(attack.fraction)
    return {
        "dataset": params.data.dataset,
        "model": params.model.name,
        "aggregator": params.aggregate.name,
        "filters": ",".join(f.name for f in params.filters) or "none",
        "partition": params.partition.scheme,
        "attack": attack.name,
        "malicious_fraction": fraction,
        "seed": str(params.seed),
        **privacy_tags(params),
        "params_hash": params_hash(params),
        "git_commit": git_commit(workdir),
        **prefect_run_tag(),
    }


def prefect_run_tag() -> dict[str, str]:
    """The Prefect flow run that made this run (the top one: a deployment's run, or the
    CLI's), so a caller holding a flow run finds its MLflow run; none outside a run."""
    from prefect.runtime import flow_run

    root = flow_run.root_flow_run_id
    return {"prefect_flow_run_id": str(root)} if root else {}


@task(name="open-training-run", cache_policy=NO_CACHE)
def open_training_run(
    params: Params,
    paths: ProjectPaths,
    *,
    resume_run_id: str | None,
    parent_run_id: str | None,
    run_name: str | None,
    history: Sequence[Mapping[str, float]] = (),
) -> Tracker:
    """The pipeline run's MLflow run (resumed, or created with its params and tags; a
    named child of ``parent_run_id`` for a comparison cell), with the partition report.
    A resumed run is given the rounds of the checkpoint's ``history`` it lacks."""
    tracker = Tracker(params.tracking.experiment)
    tracker.tags = run_tags(params, paths.root)
    if parent_run_id is not None:
        tracker.tags["mlflow.parentRunId"] = parent_run_id
    name = run_name or f"{params.data.dataset}-{params.aggregate.name}"
    tracker.start(run_id=resume_run_id, run_name=name, tags=tracker.tags)
    if tracker.run_id != resume_run_id:
        tracker.log_params(flatten_params(params.model_dump(mode="json")))
    else:  # resumed: the run now belongs to this flow run (what closes it, should it die)
        tracker.set_tags(prefect_run_tag())
        if history:
            backfilled = tracker.log_missing_rounds(history)
            if backfilled:
                log.info(
                    "the MLflow run lacked rounds %s (their tracking failed): logged now from the checkpoint",
                    backfilled,
                )
    simulated = params.federation.runtime == "simulation"  # at real sites: no partition here
    if simulated:
        for path in (paths.partition_report, paths.partition_plot):
            tracker.log_artifact(path, "partition")
    held_at_hub = simulated or params.eval.where == "hub"
    if tracker.run_id != resume_run_id and held_at_hub:  # else the run used no file here
        info = dataset_info_of(params.data)
        tracker.log_dataset(params.data.dataset, info.md5, info.url, "train")
        if simulated and paths.partition.exists():
            digest = hashlib.md5(paths.partition.read_bytes()).hexdigest()
            tracker.log_dataset("partition", digest, str(paths.partition), "partition")
    return tracker


def model_requirements() -> list[str]:
    """What the served model needs: fedsieve's engine (its reader and models, installed
    where the model is loaded) with the versions in this environment, and MLflow."""
    from importlib.metadata import version

    names = ("torch", "numpy", "pydicom", "pylibjpeg", "pylibjpeg-libjpeg",
             "pylibjpeg-openjpeg", "pylibjpeg-rle", "nibabel", "Pillow", "pandas", "mlflow")  # fmt: skip
    return [f"{name}=={version(name).split('+')[0]}" for name in names]


# MLflow's loaders of a pyfunc PythonModel: logged from code (now), or pickled (earlier)
PYTHON_MODEL_LOADERS = ("mlflow.pyfunc.loaders.code_model", "mlflow.pyfunc.model")


def _takes_image_files(uri: str, model_uri: str) -> bool:
    """Whether a registered model is this kind (a pyfunc model of image files), not a
    version an older fedsieve registered from the same run (raw torch weights)."""
    import mlflow.models

    with fluent_tracking_at(uri):
        flavors = mlflow.models.get_model_info(model_uri).flavors
    return flavors.get("python_function", {}).get("loader_module") in PYTHON_MODEL_LOADERS
