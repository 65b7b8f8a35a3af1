"""``fedsieve``: the command-line entry point.

``fedsieve run [--params FILE] [--set key=value ...] [--resume]`` runs the whole pipeline
flow; ``fedsieve partition|pretest|train|evaluate`` run one stage (what dvc.yaml calls);
``fedsieve compare`` runs the comparison grid; ``fedsieve list`` shows what can be named
in params.yaml; ``fedsieve dvc repro`` (``make run``) runs dvc with one Prefect server
shared by every stage. A bad parameter, an unusable dataset or an impossible federation
ends with exit code 2 and one line, before anything runs.

Each command is a ``(help, add_arguments, handler)`` triple in :data:`COMMANDS`; a handler
takes the parsed arguments and the project directory and returns an exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from config.environment import configure_environment
from config.errors import UsageError, exit_code, quiet_refusals, refusal_types
from fedsieve import check_simulation, explain, ops, predict
from fedsieve.arguments import (
    add_params_arguments,
    add_resume_argument,
    checked_params,
    checked_params_file,
)
from fedsieve.local_server import prefect_server

__all__ = ["COMMANDS", "console", "main"]

Handler = Callable[[argparse.Namespace, Path], int]


def _run(args: argparse.Namespace, workdir: Path) -> int:
    params = checked_params(args, workdir)
    from flows.pipeline import pipeline_flow

    with prefect_server():
        pipeline_flow(params, workdir, resume=args.resume)
    return 0


def _stage_flow(stage: str) -> Callable[..., object]:
    """The Prefect flow of one pipeline stage (imported here: Prefect loads on use)."""
    from flows.evaluate import evaluate_flow
    from flows.partition import partition_flow
    from flows.pretest import pretest_flow
    from flows.train import train_flow

    flows = {
        "partition": partition_flow,
        "pretest": pretest_flow,
        "train": train_flow,
        "evaluate": evaluate_flow,
    }
    return flows[stage]


def _stage(stage: str, *, resumable: bool = False) -> Handler:
    """The handler of one pipeline stage: check the params, then run the stage's flow."""

    def handler(args: argparse.Namespace, workdir: Path) -> int:
        params = checked_params(args, workdir)
        flow = _stage_flow(stage)
        with prefect_server():
            if resumable:
                flow(params, workdir, resume=args.resume)
            else:
                flow(params, workdir)
        return 0

    return handler


def _compare(args: argparse.Namespace, workdir: Path) -> int:
    from config.params import load_params, params_warnings
    from flows.compare import compare_flow
    from tasks.grid import grid_cells
    from tasks.preflight import check_params

    params = load_params(Path(args.params), args.overrides)
    for cell in grid_cells(params, workdir):  # every cell valid before the first one runs
        check_params(cell.params, workdir, source=f"{args.params}: cell {cell.name}")
        for warning in params_warnings(cell.params):
            print(f"fedsieve: warning: {cell.name}: {warning}", file=sys.stderr)
    if params.compare.dispatch == "deployment":
        ops.require_deployment(params.compare.deployment)
    with prefect_server():
        compare_flow(params, workdir)
    return 0


def _add_fedstnn(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", help="1d_iid | 1d_noniid_110 | 1d_noniid_60 | 2d | image")
    parser.add_argument(
        "--params", default="experiments/fedstnn/params.yaml", help="the FedStNN params set"
    )


def _fedstnn(args: argparse.Namespace, workdir: Path) -> int:
    from flows.fedstnn import fedstnn_flow
    from tasks.fedstnn import load_fedstnn_params

    overrides = load_fedstnn_params(Path(args.params), args.experiment)
    with prefect_server():
        fedstnn_flow(args.experiment, overrides, workdir)
    return 0


def _add_dvc(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dvc_args", nargs=argparse.REMAINDER, metavar="ARGS", help="dvc's own arguments"
    )


REPRODUCING = (["repro"], ["exp", "run"])  # the dvc commands that run the stages


def _dvc(args: argparse.Namespace, workdir: Path) -> int:
    """``dvc ARGS`` with one Prefect server for every stage it runs (each stage command
    would otherwise start its own); ``make run`` is ``fedsieve dvc repro``. ``repro`` and
    ``exp run`` check params.yaml first and force the stages after one that ran."""
    if not args.dvc_args:
        raise UsageError("fedsieve dvc: name a dvc command, e.g. `fedsieve dvc repro`")
    dvc_args = args.dvc_args
    for command in REPRODUCING:
        if dvc_args[: len(command)] == command:
            rest = dvc_args[len(command) :]
            _check_pipeline_params(rest, workdir)
            dvc_args = [*command, *_downstream_forced(rest)]
    with prefect_server() as url:
        print(f"fedsieve: Prefect server for every stage: {url}", file=sys.stderr)
        # In a process group of its own, so that the stage dvc is running can be stopped
        # with it: on its own it would train on, orphaned, against a stopped server.
        # the stages run `fedsieve <stage>`: this environment's, activated or not
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        dvc = subprocess.Popen(
            [sys.executable, "-m", "dvc", *dvc_args],
            env=os.environ | {"PREFECT_API_URL": url, "PATH": path},
            process_group=0,
        )
        try:
            return dvc.wait()
        except BaseException as stopping:  # SIGTERM (SystemExit 143) or Ctrl-C
            interrupt = isinstance(stopping, KeyboardInterrupt)
            _stop_process_group(dvc, signal.SIGINT if interrupt else signal.SIGTERM)
            raise


def _downstream_forced(options: list[str]) -> list[str]:
    """``--force-downstream`` before ``options``: a stage that ran is followed by every
    stage after it. Training the same params gives the same bits, so DVC would otherwise
    skip the evaluate stage after train ran (in every fresh clone, after a resumed run)
    and leave the MLflow run that train opened RUNNING, with no model."""
    return options if "--force-downstream" in options else ["--force-downstream", *options]


def _check_pipeline_params(options: list[str], workdir: Path) -> None:
    """Before ``dvc repro`` or ``dvc exp run`` (``options``: what follows) of the
    pipeline: params.yaml, with ``exp run``'s ``-S key=value`` changes, checked as every
    stage checks it. DVC deletes a stage's outputs before its command runs, so a bad value
    found by the stage would cost the committed reports; found here, it costs nothing."""
    if any(arg.startswith("experiments/") or "/dvc.yaml" in arg for arg in options):
        return  # another pipeline's stages, with params files of their own
    overrides = [
        value.removeprefix("params.yaml:")
        for option, value in itertools.pairwise(options)
        if option in ("-S", "--set-param")
    ]
    ours = [o for o in overrides if ":" not in o.partition("=")[0]]  # not other.yaml:key=…
    checked_params_file("params.yaml", ours, workdir, option="-S")


STAGE_STOP_SECONDS = 30  # a stopping stage's exit hooks: closing its MLflow run, Prefect's


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


def _add_sites(parser: argparse.ArgumentParser) -> None:
    add_params_arguments(parser)
    parser.add_argument(
        "--out", default="artifacts/sites", help="folder for each site's data and sites.json"
    )
    parser.add_argument(
        "--format", choices=("npz", "png", "dcm", "nifti", "series", "multiframe", "volumes"),
        default="npz",
        help="each site's data as one .npz, or as a folder with labels.csv of PNG or DICOM "
        "images, or of volumes: NIfTI files, DICOM series folders, multi-frame DICOM files, or "
        "(volumes) each site the next of those three",
    )  # fmt: skip


def _sites(args: argparse.Namespace, workdir: Path) -> int:
    """The params' partition (the simulated clients' data, local test splits included) as
    one data file per site, for a loopback or pilot federation (docs/federation.md)."""
    from flowerapp.site_data import IMAGE_FORMATS, VOLUME_FORMATS, write_site_files
    from tasks.data import read_dataset
    from tasks.partition import split_partition

    params = checked_params(args, workdir)
    if params.partition.root_size:
        raise UsageError("fedsieve sites: partition.root_size must be 0 (sites hold all data)")
    wrong = IMAGE_FORMATS if params.volumes else VOLUME_FORMATS
    if args.format in wrong:
        kind, allowed = (
            ("volumes", VOLUME_FORMATS) if params.volumes else ("2-D images", IMAGE_FORMATS)
        )
        raise UsageError(
            f"fedsieve sites: --format {args.format} does not fit data.dataset "
            f"{params.data.dataset}, which holds {kind}; allowed: npz, {', '.join(allowed)}"
        )
    data = read_dataset(params.data, workdir)
    partition = params.partition
    split = split_partition(
        data.train.targets, partition.scheme, partition.num_clients, params.seed,
        partition.partitioner_params(), 0, partition.local_test,
    )  # fmt: skip
    names = [f"site-{k}" for k in range(partition.num_clients)]
    out = workdir / args.out
    sites = write_site_files(data, split.clients, split.local_tests, names, out, args.format)
    unit = "volumes" if params.volumes else "images"
    for site in sites:
        print(f"{out / site['file']}: {site['samples']} training, {site['test']} held-out {unit}")
    print(f"{out / 'sites.json'}: each site's registered sample count and file hash")
    return 0


def _add_plan(parser: argparse.ArgumentParser) -> None:
    add_params_arguments(parser)
    parser.add_argument("--out", default="plan.json", help="where to write the plan")


def _plan(args: argparse.Namespace, workdir: Path) -> int:
    """The training plan the params send every site, for the sites' operators to read and
    pin (``fedsieve-site --plan``); a site refuses any task that departs from it."""
    from config.dataset import dataset_info_of
    from config.params import load_params
    from flowerapp.hub import site_task
    from flowerapp.plan import write_plan

    # validated, not preflighted: a plan names no site and reads no data (it comes before
    # the sites are registered, at a hub that may hold no images)
    params = load_params(Path(args.params), args.overrides)
    out = workdir / args.out
    digest = write_plan(out, site_task(params, dataset_info_of(params.data)))
    print(f"{out}: the sites' training plan, sha256 {digest}")
    return 0


def _list(args: argparse.Namespace, workdir: Path) -> int:
    from aggregation import (
        list_aggregators,
        list_filters,
        list_preaggregators,
        list_server_optimizers,
    )
    from federated.attacks import list_attacks
    from federated.data import is_volume_flag, list_datasets
    from federated.partition import list_partitioners
    from models import list_models

    flags = list_datasets()
    for title, names in (
        ("datasets", [flag for flag in flags if not is_volume_flag(flag)]),
        ("volume datasets (3-D)", [flag for flag in flags if is_volume_flag(flag)]),
        ("models", list_models(2)),
        ("volume models (3-D)", list_models(3)),
        ("partition schemes", list_partitioners()),
        ("aggregators", list_aggregators()),
        ("pre-aggregators", list_preaggregators()),
        ("filters", list_filters()),
        ("server optimizers", list_server_optimizers()),
        ("attacks", list_attacks()),
    ):
        print(f"{title}: {', '.join(names)}")
    return 0


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Handler]] = {
    "run": (
        "run the whole pipeline flow (partition -> train -> evaluate)",
        add_resume_argument,
        _run,
    ),
    "partition": (
        "partition the dataset across clients",
        add_params_arguments,
        _stage("partition"),
    ),
    "pretest": (
        "normality pre-test of the clients' updates",
        add_params_arguments,
        _stage("pretest"),
    ),
    "train": (
        "run the federated training rounds",
        add_resume_argument,
        _stage("train", resumable=True),
    ),
    "evaluate": (
        "evaluate the final model, log and register it",
        add_params_arguments,
        _stage("evaluate"),
    ),
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
    "sites": (
        "write the partition as one data file per site (a loopback or pilot federation)",
        _add_sites,
        _sites,
    ),
    "plan": (
        "write the training plan every site approves (fedsieve-site --plan)",
        _add_plan,
        _plan,
    ),
    "list": (
        "list datasets, models, partition schemes, rules, pre-aggregators, filters, attacks",
        lambda p: None,
        _list,
    ),
    "serve": (
        "serve the pipeline as a Prefect deployment on a cron schedule",
        ops.add_serve_arguments,
        ops.serve,
    ),
    "explain": (
        "why a client counted less in a round, from the exclusion trail",
        explain.add_explain_arguments,
        explain.explain,
    ),
    "runs": ("table of recent MLflow runs, sortable by a metric", ops.add_runs_arguments, ops.runs),
    "promote": (
        "alias the best registered model version 'champion' by a run metric",
        ops.add_promote_arguments,
        ops.promote,
    ),
    "check-simulation": (
        "compare the last run at real sites with its simulation from the sites' data",
        check_simulation.add_check_arguments,
        check_simulation.check_simulation,
    ),
    "predict": (
        "apply the registered model (or a model folder) to image files: classes, probabilities",
        predict.add_predict_arguments,
        predict.predict,
    ),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedsieve", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (text, add_arguments, _) in COMMANDS.items():
        add_arguments(commands.add_parser(name, help=text, description=text))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code. The process environment is set first
    (telemetry off, PREFECT_HOME in the project), before a handler loads Prefect or MLflow.
    A refusal (bad input, no server, a run failed closed, a model the gate refused) ends
    it in one line, with no traceback from the command or from its Prefect runs."""
    configure_environment()
    quiet_refusals()
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command][2](args, Path.cwd())
    except refusal_types() as error:
        print(f"fedsieve: error: {error}", file=sys.stderr)
        return exit_code(error)


def console(argv: Sequence[str] | None = None) -> None:
    """The ``fedsieve`` command. SIGTERM (how Prefect workers and ``kill`` cancel a run)
    ends it like an error does, through its exit hooks: the MLflow run is closed KILLED,
    the flow run marked crashed, the command's Prefect server stopped."""
    signal.signal(signal.SIGTERM, _terminated)
    try:
        code = main(argv)
    except KeyboardInterrupt:  # Ctrl-C: Prefect has logged the crash; no traceback
        print("fedsieve: interrupted", file=sys.stderr)
        code = 130
    except Terminated as stopped:  # its exit hooks have run: the run is closed, its server gone
        print("fedsieve: terminated (SIGTERM)", file=sys.stderr)
        code = stopped.code
    sys.exit(code)


class Terminated(SystemExit):
    """SIGTERM's exit: a SystemExit, so that it unwinds through every exit hook as an
    error does, and a type of its own, so that the command's last line can say why."""


def _terminated(signum: int, _frame: object) -> None:
    raise Terminated(128 + signum)


if __name__ == "__main__":
    console()
