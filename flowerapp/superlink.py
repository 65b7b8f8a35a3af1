"""The hub operator's SuperLink: Flower's ``flower-superlink`` with fedsieve's settings.

    .venv-flower/bin/python -m flowerapp.superlink --certs certs --database hub.db \\
        --fleet-api-address 0.0.0.0:9092

TLS from the ``certs`` folder ``python -m flowerapp.certs`` writes (``ca.crt``,
``server.pem``, ``server.key``), SuperNode authentication on (only registered keys join),
the Control and ServerAppIo APIs on 127.0.0.1, no runtime installation of app
dependencies. It runs in the environment of every Flower process fedsieve starts
(:func:`flowerapp.flwr_config.flower_env`: this environment's ``bin`` first on PATH, as
the SuperLink starts ``flower-superexec`` through it; Flower's telemetry and update check
off). The SuperLink logs one INFO line each time a SuperNode polls for work (every few
seconds per site); those lines are dropped here, in the SuperLink's process only (its
ServerApps log as before); ``FLWR_LOG_LEVEL=DEBUG`` keeps them.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from flowerapp.flwr_config import flower_env

__all__ = ["PollFilter", "main", "superlink_args"]

POLL_LINES = ("[Fleet.PullMessages]",)  # INFO, once per SuperNode poll (flwr 1.32.1)


class PollFilter(logging.Filter):
    """Drops the Fleet API's per-poll INFO records; warnings and errors always pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or not str(record.msg).startswith(POLL_LINES)


def superlink_args(args: argparse.Namespace) -> list[str]:
    """``flower-superlink``'s options for these settings."""
    certs: Path = args.certs
    return [
        "--ssl-ca-certfile", str(certs / "ca.crt"),
        "--ssl-certfile", str(certs / "server.pem"),
        "--ssl-keyfile", str(certs / "server.key"),
        "--enable-supernode-auth",
        "--isolation", "subprocess",
        "--database", str(args.database),
        "--fleet-api-address", args.fleet_api_address,
        "--control-api-address", args.control_api_address,
        "--serverappio-api-address", args.serverappio_api_address,
        "--disable-runtime-dependency-installation",
    ]  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flowerapp.superlink", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--certs", type=Path, required=True, help="ca.crt, server.pem, server.key")
    parser.add_argument("--database", type=Path, required=True, help="the SuperLink's SQLite file")
    parser.add_argument("--fleet-api-address", default="0.0.0.0:9092", help="where sites connect")
    parser.add_argument("--control-api-address", default="127.0.0.1:9093", help="the flwr CLI's")
    parser.add_argument("--serverappio-api-address", default="127.0.0.1:9091")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    missing = [name for name in ("ca.crt", "server.pem", "server.key")
               if not (args.certs / name).is_file()]  # fmt: skip
    if missing:
        print(
            f"flowerapp.superlink: error: {args.certs} lacks {', '.join(missing)}: write them "
            "with `python -m flowerapp.certs --out DIR --host <the hub's name>`",
            file=sys.stderr,
        )
        return 2
    # before Flower is imported: its telemetry switch is read at import
    os.environ.update(flower_env(Path(sys.executable).parent))
    from flwr.common.logger import FLOWER_LOGGER
    from flwr.server.app import run_superlink  # what the flower-superlink command runs

    if os.environ.get("FLWR_LOG_LEVEL", "").upper() != "DEBUG":
        FLOWER_LOGGER.addFilter(PollFilter())
    sys.argv = ["flower-superlink", *superlink_args(args)]
    run_superlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
