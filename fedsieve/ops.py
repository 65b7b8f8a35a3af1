"""Operating the pipeline: ``fedsieve serve``, ``fedsieve runs``, ``fedsieve promote``.

- ``serve`` registers the pipeline flow as a Prefect deployment on a cron schedule and
  runs its scheduled runs in this process (a Prefect server must be running).
- ``runs`` prints recent MLflow runs (tags and final metrics), sortable by a metric.
- ``promote`` sets the registry alias ``champion`` on the model version whose run scored
  best on a metric.

Everything reads the tracking store of :func:`config.environment.tracking_uri`
(``MLFLOW_TRACKING_URI`` or the project's ``sqlite:///mlflow.db``). Bad input ends with one
line and exit code 2; an unusable tracking store or Prefect server with exit code 1.
MLflow and Prefect are imported inside the handlers so other commands stay fast.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from config.environment import tracking_uri
from config.errors import OpsError, ServiceError
from fedsieve.arguments import add_params_arguments, checked_params, positive_int

__all__ = [
    "Champion",
    "RunRow",
    "add_promote_arguments",
    "add_runs_arguments",
    "add_serve_arguments",
    "final_metric",
    "format_runs",
    "list_runs",
    "promote",
    "promote_champion",
    "runs",
    "serve",
]

CHAMPION = "champion"
DEFAULT_EXPERIMENT = "fedsieve"
KEY_METRICS = ("final_test_acc", "final_test_auc", "final_test_loss")
_METRIC_NAME = re.compile(r"^[A-Za-z0-9_./-]+$")


# -- metrics -------------------------------------------------------------------------------


def final_metric(name: str) -> str:
    """``test_auc`` -> ``final_test_auc`` (the evaluate stage's final metrics); a name that
    already starts with ``final_`` is kept."""
    name = name.strip()
    if not _METRIC_NAME.match(name):
        raise OpsError(f"metric {name!r}: allowed characters are letters, digits and _ . / -")
    return name if name.startswith("final_") else f"final_{name}"


def lower_is_better(metric: str) -> bool:
    return "loss" in metric


# -- MLflow access ---------------------------------------------------------------------------


def _client(uri: str | None = None) -> Any:
    """An MlflowClient on ``uri``; a missing SQLite file is refused rather than created."""
    from mlflow import MlflowClient

    uri = uri or tracking_uri()
    if uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        if not path.exists():
            raise ServiceError(
                f"no MLflow store at {path} (tracking URI {uri}): run the pipeline first, "
                "or set MLFLOW_TRACKING_URI to your tracking server"
            )
    return MlflowClient(uri)


def _mlflow_call(uri: str, what: str, call: Callable[[], Any]) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        return call()
    except MlflowException as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ServiceError(f"MLflow at {uri}: {what} failed ({first})") from None


def _experiment_id(client: Any, name: str) -> str:
    experiment = _mlflow_call(
        client.tracking_uri,
        "looking up the experiment",
        lambda: client.get_experiment_by_name(name),
    )
    if experiment is None:
        names = [
            e.name
            for e in _mlflow_call(
                client.tracking_uri, "listing experiments", lambda: client.search_experiments()
            )
        ]
        raise OpsError(
            f"no MLflow experiment named {name!r} at {client.tracking_uri}; "
            f"experiments there: {', '.join(names) or 'none'}"
        )
    return experiment.experiment_id


# -- fedsieve runs ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RunRow:
    """One line of ``fedsieve runs``."""

    run_id: str
    name: str
    started: datetime | None
    status: str
    tags: dict[str, str]
    metrics: dict[str, float]


def list_runs(
    client: Any, experiment: str, *, sort: str | None = None, limit: int = 20
) -> list[RunRow]:
    """The ``limit`` most recent runs of ``experiment``, or the best ``limit`` by the final
    metric ``sort`` (descending; ascending for losses). Runs without it come last."""
    experiment_id = _experiment_id(client, experiment)
    if sort is None:
        order = ["attributes.start_time DESC"]
    else:
        order = [f"metrics.`{sort}` {'ASC' if lower_is_better(sort) else 'DESC'}"]
    found = _mlflow_call(
        client.tracking_uri,
        "searching runs",
        lambda: client.search_runs([experiment_id], order_by=order, max_results=limit),
    )
    rows = [
        RunRow(
            run_id=run.info.run_id,
            name=run.info.run_name or "",
            started=(
                datetime.fromtimestamp(run.info.start_time / 1000).astimezone()
                if run.info.start_time
                else None
            ),
            status=run.info.status,
            tags=dict(run.data.tags),
            metrics=dict(run.data.metrics),
        )
        for run in found
    ]
    if sort is not None:  # stable: runs lacking the metric last, whatever the store does
        rows.sort(key=lambda row: sort not in row.metrics)
    return rows


def format_runs(rows: Sequence[RunRow], *, sort: str | None = None) -> str:
    metrics = [*KEY_METRICS, *([sort] if sort and sort not in KEY_METRICS else [])]
    header = [
        "run_id",
        "run",
        "started",
        "status",
        "dataset",
        "aggregator",
        "filters",
        "attack",
        "seed",
        *(m.removeprefix("final_") for m in metrics),
    ]
    table = [header]
    for row in rows:
        tags = row.tags
        table.append(
            [
                row.run_id[:8],
                row.name or "-",
                row.started.strftime("%Y-%m-%d %H:%M") if row.started else "-",
                row.status,
                tags.get("dataset", "-"),
                tags.get("aggregator", "-"),
                tags.get("filters", "-"),
                tags.get("attack", "-"),
                tags.get("seed", "-"),
                *(f"{row.metrics[m]:.4f}" if m in row.metrics else "-" for m in metrics),
            ]
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in table
    )


def add_runs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sort",
        metavar="METRIC",
        help="order by this final metric (test_auc, test_acc, test_loss, ...); best first "
        "(lowest for losses). Default: most recent first",
    )
    parser.add_argument("--limit", type=positive_int, default=20, help="how many runs (default 20)")
    parser.add_argument(
        "--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment (default fedsieve)"
    )


def runs(args: argparse.Namespace, workdir: Path) -> int:
    sort = final_metric(args.sort) if args.sort else None
    client = _client()
    rows = list_runs(client, args.experiment, sort=sort, limit=args.limit)
    if not rows:
        print(f"no runs in experiment {args.experiment!r} at {client.tracking_uri}")
        return 0
    print(format_runs(rows, sort=sort))
    return 0


# -- fedsieve promote ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Champion:
    """The model version given the alias, and why."""

    model: str
    version: str
    run_id: str
    run_name: str
    metric: str
    value: float
    previous_version: str | None


def _registered_model(client: Any, model: str | None) -> str:
    models = sorted(
        m.name
        for m in _mlflow_call(
            client.tracking_uri,
            "listing registered models",
            lambda: client.search_registered_models(),
        )
    )
    if model is not None:
        if model not in models:
            raise OpsError(
                f"--model {model!r}: no such registered model; registered: "
                f"{', '.join(models) or 'none'}"
            )
        return model
    if not models:
        raise OpsError(
            f"no registered models at {client.tracking_uri}: run the pipeline with "
            "tracking.register_model: true first"
        )
    if len(models) > 1:
        raise OpsError(
            f"several registered models ({', '.join(models)}): choose one with --model NAME"
        )
    return models[0]


def promote_champion(
    client: Any,
    metric: str,
    *,
    model: str | None = None,
    experiment: str | None = None,
    alias: str = CHAMPION,
) -> Champion:
    """Give ``alias`` to the version of ``model`` whose run has the best final ``metric``
    (highest; lowest for losses; the newest version among equals)."""
    metric = final_metric(metric)
    name = _registered_model(client, model)
    experiment_id = _experiment_id(client, experiment) if experiment else None
    escaped = name.replace("'", "\\'")
    versions = _mlflow_call(
        client.tracking_uri,
        "listing model versions",
        lambda: client.search_model_versions(f"name='{escaped}'"),
    )
    scored: list[tuple[float, int, Any, Any]] = []
    for version in versions:
        if not version.run_id:
            continue
        try:
            run = client.get_run(version.run_id)
        except Exception:  # run deleted or in another store: it cannot be compared
            continue
        if experiment_id is not None and run.info.experiment_id != experiment_id:
            continue
        if metric in run.data.metrics:
            scored.append((run.data.metrics[metric], int(version.version), version, run))
    if not scored:
        where = f" in experiment {experiment!r}" if experiment else ""
        raise OpsError(
            f"no version of {name!r}{where} has a run with metric {metric!r} "
            f"({len(versions)} version(s) checked)"
        )
    sign = -1.0 if lower_is_better(metric) else 1.0
    value, _, version, run = max(scored, key=lambda item: (sign * item[0], item[1]))
    try:
        previous = client.get_model_version_by_alias(name, alias).version
    except Exception:  # no such alias yet
        previous = None
    _mlflow_call(
        client.tracking_uri,
        "setting the alias",
        lambda: client.set_registered_model_alias(name, alias, version.version),
    )
    return Champion(
        model=name,
        version=str(version.version),
        run_id=run.info.run_id,
        run_name=run.info.run_name or "",
        metric=metric,
        value=value,
        previous_version=None if previous is None else str(previous),
    )


def add_promote_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metric",
        required=True,
        help="final metric to maximise (minimised for losses), e.g. test_auc",
    )
    parser.add_argument(
        "--model", help="registered model (default: the only one, e.g. fedsieve-breastmnist)"
    )
    parser.add_argument("--experiment", help="only consider runs of this MLflow experiment")


def promote(args: argparse.Namespace, workdir: Path) -> int:
    metric = final_metric(args.metric)
    client = _client()
    champion = promote_champion(client, metric, model=args.model, experiment=args.experiment)
    was = (
        f" (was version {champion.previous_version})"
        if champion.previous_version not in (None, champion.version)
        else ""
    )
    print(
        f"{champion.model} version {champion.version} is now @{CHAMPION}{was}: run "
        f"{champion.run_id} ({champion.run_name}), {champion.metric} = {champion.value:.4f}"
    )
    print(
        f"apply it: fedsieve predict FILES... --model models:/{champion.model}@{CHAMPION}, or "
        f"mlflow.pyfunc.load_model('models:/{champion.model}@{CHAMPION}')"
    )
    return 0


# -- fedsieve serve --------------------------------------------------------------------------


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    add_params_arguments(parser)
    parser.add_argument(
        "--cron",
        required=True,
        metavar="EXPR",
        help='cron schedule in UTC, e.g. "0 2 * * *" (every night at 02:00)',
    )
    parser.add_argument(
        "--name",
        default="fedsieve-scheduled",
        help="deployment name (default fedsieve-scheduled; shown as pipeline/NAME)",
    )


def _check_cron(expression: str) -> None:
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        CronSchedule(cron=expression)
    except ValidationError:
        raise OpsError(
            f'--cron {expression!r}: not a cron expression; expected 5 fields, e.g. "0 2 * * *"'
        ) from None


def _prefect_api(purpose: str = "fedsieve serve") -> str:
    """The running Prefect server's API URL; a temporary server would never schedule."""
    import httpx
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if not url:
        raise ServiceError(
            f"{purpose} needs a running Prefect server: start `prefect server start` "
            "and set PREFECT_API_URL=http://127.0.0.1:4200/api"
        )
    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=10).raise_for_status()
    except httpx.HTTPError as error:
        raise ServiceError(f"Prefect server at {url} is not reachable ({error})") from None
    return url


def require_deployment(name: str) -> None:
    """Fail before a grid starts when ``flow/deployment`` is not on the Prefect server
    (asked with Prefect's client: it sends the server's auth string, where one is set)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    url = _prefect_api("compare.dispatch: deployment")
    try:
        with get_client(sync_client=True) as client:
            client.read_deployment_by_name(name)
    except ObjectNotFound:
        raise ServiceError(
            f"compare.deployment {name!r} is not on the Prefect server at {url}: deploy it "
            "with `prefect --no-prompt deploy --all` and start workers with "
            "`prefect worker start --pool fedsieve`"
        ) from None


def serve(args: argparse.Namespace, workdir: Path) -> int:
    if not args.name or "/" in args.name:
        raise OpsError(f"--name {args.name!r}: a deployment name must be non-empty, without '/'")
    _check_cron(args.cron)
    params = checked_params(args, workdir)
    url = _prefect_api()
    import flows.pipeline

    # Served from source, so each run starts as `python -m prefect.engine` importing the
    # flow's module afresh (like a worker). An in-memory flow is instead shipped to its run
    # process by cloudpickle, by value, which loses the module globals that the flows'
    # postponed annotations (`params: Params`) need: the run fails parameter validation.
    checkout = Path(flows.pipeline.__file__).resolve().parents[1]
    served = flows.pipeline.pipeline_flow.from_source(
        source=str(checkout), entrypoint="flows/pipeline.py:pipeline_flow"
    )
    print(
        f"serving deployment pipeline/{args.name} on cron {args.cron!r} (UTC) against {url}; "
        "Ctrl-C stops serving and pauses the schedule",
        flush=True,
    )
    served.serve(
        name=args.name,
        cron=args.cron,
        # what was set, as a grid's cells send it: a full dump would "set" every default
        # and trip the checks of settings given without effect (privacy.clip with privacy
        # off), failing every run of the deployment at parameter validation
        parameters={
            "params": params.model_dump(mode="json", exclude_unset=True),
            "workdir": str(workdir.resolve()),
        },
        tags=["fedsieve"],
        limit=1,  # runs share the workdir (reports/, checkpoints): one at a time
    )
    return 0
