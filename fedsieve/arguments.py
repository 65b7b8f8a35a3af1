"""Arguments shared by the commands that take a params file (``--params``, ``--set``,
``--resume``), and the params they name, validated and preflight-checked."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from config.params import Params

__all__ = [
    "add_params_arguments",
    "add_resume_argument",
    "checked_params",
    "checked_params_file",
    "positive_int",
]


def positive_int(text: str) -> int:
    """An argparse type for counts (seeds, workers, runs): argparse's one-line error on 0,
    a negative or a non-integer, instead of a silent default or an empty run."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


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


def add_resume_argument(parser: argparse.ArgumentParser) -> None:
    add_params_arguments(parser)
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the checkpoint of an interrupted run with the same params",
    )


def checked_params(args: argparse.Namespace, workdir: Path) -> Params:
    """The params file with its overrides, checked (:func:`checked_params_file`); warnings
    printed once."""
    from config.params import params_warnings

    params = checked_params_file(args.params, args.overrides, workdir)
    for warning in params_warnings(params):
        print(f"fedsieve: warning: {warning}", file=sys.stderr)
    return params


def checked_params_file(
    path: str, overrides: list[str] | None, workdir: Path, option: str = "--set"
) -> Params:
    """``path`` with ``key=value`` overrides (given by ``option``), validated and
    preflight-checked (data, partition, rules against the clients per round). (Imported
    here: commands that take no params, ``fedsieve dvc`` and ``list``, need neither torch
    nor Prefect.)"""
    from config.params import given_source, load_params, override_keys
    from tasks.preflight import check_params

    params = load_params(Path(path), overrides, option)
    source = given_source(path, override_keys(overrides), option)
    check_params(params, workdir, source=source)
    return params
