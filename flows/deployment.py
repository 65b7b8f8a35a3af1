"""The pipeline as a deployable flow: plain-JSON parameters, params read on the worker.

``prefect.yaml`` deploys this flow to the ``fedsieve`` process work pool, so that
``prefect worker start --pool fedsieve`` on any machine runs it in that machine's
checkout: the params file is read and validated there, at run time (exactly as
``fedsieve run --params FILE --set KEY=VALUE ...`` would), then :func:`pipeline_flow`
runs as a subflow. Relative ``params_path`` is taken inside ``workdir``; a relative
``workdir`` inside the flow run's working directory (the pull step's checkout).

A comparison grid dispatched to workers (``compare.dispatch: deployment``) sends each cell
as a whole params mapping (``params``) with its own ``workdir`` and its MLflow parent run;
a relative ``data.root`` in such a mapping is taken in the checkout, so the cells on one
machine share its data.

No ``from __future__ import annotations`` here: Prefect validates a run's parameters
against these annotations, and a flow shipped to its run process by value (``serve``)
keeps only the globals its body uses, so string annotations could not be resolved.
"""

from pathlib import Path
from typing import Any

from prefect import flow

from config.errors import quiet_refusals
from config.params import DataParams, load_params, validate_params
from flows.pipeline import pipeline_flow

__all__ = ["pipeline_from_file"]


@flow(name="pipeline-from-file")
def pipeline_from_file(
    params_path: str = "params.yaml",
    overrides: list[str] | None = None,
    workdir: str = ".",
    resume: bool = False,
    params: dict[str, Any] | None = None,
    parent_run_id: str | None = None,
    run_name: str | None = None,
) -> dict[str, Any]:
    """Load ``params_path`` with ``overrides`` (``["train.rounds=3", ...]``), or take the
    ``params`` mapping, and run the whole pipeline in ``workdir``. A refusal ends the
    run failed with its one line and no traceback, as from the CLI."""
    quiet_refusals()  # this process is the worker's, not the CLI's
    root = Path(workdir).resolve()
    if params is None:
        loaded = load_params(root / params_path, list(overrides or []))
    else:
        data = params.get("data", {})
        checkout_root = str(Path.cwd() / data.get("root", DataParams().root))
        loaded = validate_params(
            {**params, "data": {**data, "root": checkout_root}}, "params (deployment run)"
        )
    return pipeline_flow(
        loaded, root, resume=resume, parent_run_id=parent_run_id, run_name=run_name
    )
