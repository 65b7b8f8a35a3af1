"""``fedsieve``: the command-line entry point.

``fedsieve run [--params FILE] [--set key=value ...] [--resume]`` runs the whole pipeline
flow; ``fedsieve partition|train|evaluate`` run one stage (what dvc.yaml calls);
``fedsieve list`` shows what can be named in params.yaml; ``fedsieve dvc repro`` (``make
run``) runs dvc with one Prefect server shared by every stage. A bad parameter, an unusable
dataset or an impossible partition ends with exit code 2 and one line, before anything
runs.

Each command is a ``(add_arguments, handler)`` pair in :data:`COMMANDS`; a handler takes
the parsed arguments and the project directory and returns an exit code.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fedsieve  # noqa: F401  (environment first)
from fedsieve import ops, prefect_server, startup

if TYPE_CHECKING:
    from fedsieve.config import Params

__all__ = ["COMMANDS", "console", "main"]

Handler = Callable[[argparse.Namespace, Path], int]
# Commands that run flows: Prefect's temporary server is launched before anything else.
FLOW_COMMANDS = frozenset(
    {"run", "partition", "pretest", "train", "evaluate", "compare", "fedstnn"}
)
# Commands that track: the tracking process warms up from the start too (and prepares
# log_model where the command logs the model).
TRACKING_COMMANDS = {
    "run": True, "train": False, "evaluate": True, "compare": False, "fedstnn": False
}  # fmt: skip


def usage_errors() -> tuple[type[Exception], ...]:
    """Errors that are the user's to fix: one line and exit code 2, no traceback."""
    from federated.data import DataError
    from federated.partition import PartitionError
    from federated.registry import RegistryError
    from fedsieve.config import ConfigError

    return (ConfigError, DataError, PartitionError, RegistryError, ops.OpsError)


def add_params_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", default="params.yaml", help="params file (default params.yaml)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one parameter, e.g. --set train.rounds=3 (repeatable)",
    )


def _add_resume(parser: argparse.ArgumentParser) -> None:
    add_params_arguments(parser)
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the checkpoint of an interrupted run with the same params",
    )


def params_from(args: argparse.Namespace) -> Params:
    from fedsieve.config import load_params

    return load_params(Path(args.params), args.overrides)


def _warn(params: Params, prefix: str = "") -> None:
    from fedsieve.config import params_warnings

    for warning in params_warnings(params):
        print(f"fedsieve: warning: {prefix}{warning}", file=sys.stderr)


def preflight(params: Params, workdir: Path) -> None:
    """Fail before any flow starts: the dataset must be usable and the partition possible."""
    from federated.data import ensure_medmnist, load_medmnist
    from federated.partition import build_partitioner
    from tasks.data import data_root

    root = data_root(params.data.root, workdir)
    ensure_medmnist(
        params.data.dataset, root, download=params.data.download, progress=sys.stderr.isatty()
    )
    labels = load_medmnist(params.data.dataset, root).train.targets
    build_partitioner(params.partition.scheme, **params.partition.partitioner_params())(
        labels, params.partition.num_clients, seed=params.seed
    )


def _flow(target: str) -> Callable[..., Any]:
    """The flow ``module:name``, bound to the Prefect server launched at the command's
    start (imported while that server boots; called once the input is known good)."""
    module, name = target.split(":")
    flow = prefect_server.bind(getattr(importlib.import_module(module), name))
    startup.resume_collector()  # paused since main() began: the imports are done
    return flow


def _run(args: argparse.Namespace, workdir: Path) -> int:
    params = params_from(args)
    preflight(params, workdir)
    _warn(params)
    _flow("flows.pipeline:pipeline_flow")(params, workdir, resume=args.resume)
    return 0


def _partition(args: argparse.Namespace, workdir: Path) -> int:
    params = params_from(args)
    preflight(params, workdir)
    _flow("flows.partition:partition_flow")(params, workdir)
    return 0


def _pretest(args: argparse.Namespace, workdir: Path) -> int:
    _flow("flows.pretest:pretest_flow")(params_from(args), workdir)
    return 0


def _train(args: argparse.Namespace, workdir: Path) -> int:
    params = params_from(args)
    _warn(params)
    _flow("flows.train:train_flow")(params, workdir, resume=args.resume)
    return 0


def _evaluate(args: argparse.Namespace, workdir: Path) -> int:
    _flow("flows.evaluate:evaluate_flow")(params_from(args), workdir)
    return 0


def _compare(args: argparse.Namespace, workdir: Path) -> int:
    params = params_from(args)
    from flows.compare import grid_cells

    for cell in grid_cells(params, workdir):  # every cell valid before the first one runs
        preflight(cell.params, workdir)
        _warn(cell.params, prefix=f"{cell.name}: ")
    if params.compare.dispatch == "deployment":
        ops.require_deployment(params.compare.deployment)
    _flow("flows.compare:compare_flow")(params, workdir)
    return 0


def _add_fedstnn(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", help="1d_iid | 1d_noniid_110 | 1d_noniid_60 | 2d | image")
    parser.add_argument(
        "--params", default="experiments/fedstnn/params.yaml", help="the FedStNN params set"
    )


def _fedstnn(args: argparse.Namespace, workdir: Path) -> int:
    from fedsieve.config import ConfigError
    from flows.fedstnn import load_fedstnn_params

    try:
        overrides = load_fedstnn_params(Path(args.params), args.experiment)
    except (ValueError, TypeError, FileNotFoundError) as error:
        raise ConfigError(str(error)) from None
    _flow("flows.fedstnn:fedstnn_flow")(args.experiment, overrides, workdir)
    return 0


def _add_dvc(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dvc_args", nargs=argparse.REMAINDER, metavar="ARGS", help="dvc's own arguments"
    )


def _dvc(args: argparse.Namespace, workdir: Path) -> int:
    """``dvc ARGS`` with one Prefect server for every stage it runs (each stage would
    otherwise start its own temporary server); ``make run`` is ``fedsieve dvc repro``."""
    if not args.dvc_args:
        raise SystemExit("fedsieve dvc: name a dvc command, e.g. `fedsieve dvc repro`")
    with prefect_server.shared() as env:
        print(
            f"fedsieve: Prefect server for every stage: {env['PREFECT_API_URL']}", file=sys.stderr
        )
        # In a process group of its own, so that the stage dvc is running can be stopped
        # with it: on its own it would train on, orphaned, against a stopped server.
        dvc = subprocess.Popen(
            [sys.executable, "-m", "dvc", *args.dvc_args], env=env, process_group=0
        )
        try:
            return dvc.wait()
        except BaseException as stopping:  # SIGTERM (SystemExit 143) or Ctrl-C
            interrupt = isinstance(stopping, KeyboardInterrupt)
            _stop_process_group(dvc, signal.SIGINT if interrupt else signal.SIGTERM)
            raise


STAGE_STOP_SECONDS = 30  # a stopping stage's exit hooks: tracker flush, Prefect's workers


def _stop_process_group(leader: subprocess.Popen[bytes], signum: int) -> None:
    """Send ``signum`` to ``leader``'s process group and wait for every process in it to
    exit (a stage may outlive dvc by its exit hooks); SIGKILL what is left after
    :data:`STAGE_STOP_SECONDS`."""
    group = leader.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signum)
    deadline = time.monotonic() + STAGE_STOP_SECONDS
    with contextlib.suppress(subprocess.TimeoutExpired):
        leader.wait(timeout=STAGE_STOP_SECONDS)
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)  # anyone left?
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)
    leader.wait()


def _list(args: argparse.Namespace, workdir: Path) -> int:
    from aggregation import list_aggregators, list_filters
    from federated.data import list_datasets
    from federated.partition import list_partitioners
    from models import list_models

    for title, names in (
        ("datasets", list_datasets()),
        ("models", list_models()),
        ("partition schemes", list_partitioners()),
        ("aggregators", list_aggregators()),
        ("filters", list_filters()),
    ):
        print(f"{title}: {', '.join(names)}")
    return 0


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Handler]] = {
    "run": ("run the whole pipeline flow (partition -> train -> evaluate)", _add_resume, _run),
    "partition": ("partition the dataset across clients", add_params_arguments, _partition),
    "pretest": ("normality pre-test of the clients' updates", add_params_arguments, _pretest),
    "train": ("run the federated training rounds", _add_resume, _train),
    "evaluate": ("evaluate the final model, log and register it", add_params_arguments, _evaluate),
    "compare": (
        "run the comparison grid (methods x attacks x fractions x seeds) as child runs",
        add_params_arguments,
        _compare,
    ),
    "fedstnn": ("run a FedStNN experiment (stochastic neural networks)", _add_fedstnn, _fedstnn),
    "dvc": (
        "run a dvc command (repro, exp run) with one Prefect server shared by its stages",
        _add_dvc,
        _dvc,
    ),
    "list": ("list datasets, models, partition schemes, rules and filters", lambda p: None, _list),
    "serve": (
        "serve the pipeline as a Prefect deployment on a cron schedule",
        ops.add_serve_arguments,
        ops.serve,
    ),
    "runs": ("table of recent MLflow runs, sortable by a metric", ops.add_runs_arguments, ops.runs),
    "promote": (
        "alias the best registered model version 'champion' by a run metric",
        ops.add_promote_arguments,
        ops.promote,
    ),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedsieve", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (text, add_arguments, _) in COMMANDS.items():
        add_arguments(commands.add_parser(name, help=text, description=text))
    return parser


def main(argv: Sequence[str] | None = None, *, owns_process: bool = False) -> int:
    """Run one command. ``owns_process``: this process is the command's own (not a test's
    or a library caller's), so its tracking process may be a fork of it."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # a flow command's imports run with the garbage collector paused until its flow starts
    paused = args.command in FLOW_COMMANDS and startup.pause_collector(freeze=owns_process)
    try:
        if args.command in FLOW_COMMANDS:
            prefect_server.start_early()  # boots while the command reads and checks its input
        if args.command in TRACKING_COMMANDS:
            from fedsieve import tracking

            tracking.warm_up(model=TRACKING_COMMANDS[args.command], fork=owns_process)
        return COMMANDS[args.command][2](args, Path.cwd())
    except usage_errors() as error:
        prefect_server.discard()  # silently, with the database it may have created
        print(f"fedsieve: error: {error}", file=sys.stderr)
        return 2
    except ops.ServiceError as error:  # a tracking store or Prefect server that is not there
        print(f"fedsieve: error: {error}", file=sys.stderr)
        return 1
    finally:
        if paused:
            startup.resume_collector()


_exit_status = 1  # what console() ends with: an uncaught exception unless main() returns


def console(argv: Sequence[str] | None = None) -> None:
    """The ``fedsieve`` command: :func:`main`, ended without Python's module teardown.

    Every exit hook still runs first (Prefect's log and event workers drain, the temporary
    server stops, MLflow and logging flush); only the interpreter's clean-up of torch,
    Prefect and MLflow modules is skipped, 1-1.5 s that a finished command does not need.
    Tests call :func:`main`, which returns normally.
    """
    global _exit_status
    atexit.register(_end_now)  # registered before every hook but logging's: runs after them
    signal.signal(signal.SIGTERM, _terminated)
    try:
        _exit_status = main(argv, owns_process=True)
    except SystemExit as stop:  # argparse and `fedsieve dvc` exit this way
        code = stop.code
        _exit_status = code if isinstance(code, int) else int(code is not None)
        raise
    except KeyboardInterrupt:  # Ctrl-C: Prefect has logged the crash; no traceback
        print("fedsieve: interrupted", file=sys.stderr)
        _exit_status = 130
    sys.exit(_exit_status)


def _terminated(signum: int, _frame: object) -> None:
    """SIGTERM (how Prefect workers and ``kill`` cancel a run) ends the command like an
    error does, through the exit hooks: the temporary server stops and a flow run is
    marked crashed. By default the signal skips them and the server is left running."""
    raise SystemExit(128 + signum)


def _end_now() -> None:
    logging.shutdown()  # its own exit hook was registered earlier, so it would run later
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status)


if __name__ == "__main__":
    console()
