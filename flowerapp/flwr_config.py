"""Flower's two small configuration formats, written in one place: the ``key=value``
pairs of ``--node-config`` / ``--run-config`` (TOML values), and the ``flwr`` CLI's
``config.toml`` naming a SuperLink connection. The site command, the hub's train stage,
the loopback harness and the container smoke test all write them through here. And the
environment every Flower process fedsieve starts runs in (:func:`flower_env`).

    python -m flowerapp.flwr_config --home DIR --connection hub --address HOST:9093 --ca ca.crt

writes ``DIR/config.toml`` (what the hub's worker container does before it starts: the
compose stack's federation overlay)."""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

from config.environment import FLOWER_TELEMETRY_OFF

__all__ = ["ConfigValue", "config_pairs", "flower_env", "write_cli_config"]

ConfigValue = str | int | float | bool
_KEY = re.compile(r"[A-Za-z0-9_.-]+")


def _toml_value(value: ConfigValue) -> str:
    """One value as Flower's `k=v` parser reads it (TOML; strings must not hold a quote)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if '"' in value:
        raise ValueError(f"Flower's k=v config parser cannot carry a double quote: {value!r}")
    return json.dumps(value)


def config_pairs(config: Mapping[str, ConfigValue]) -> list[str]:
    """`key=value` strings for `--node-config` / `--run-config`."""
    pairs = []
    for key, value in config.items():
        if not _KEY.fullmatch(key):
            raise ValueError(f"config key {key!r} must match {_KEY.pattern}")
        pairs.append(f"{key}={_toml_value(value)}")
    return pairs


def flower_env(bin_dir: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (the process environment) for a Flower process: ``bin_dir`` first on PATH
    (a SuperLink or SuperNode starts ``flower-superexec`` and the apps through PATH),
    Flower's telemetry and update check off, no runtime installation of app dependencies
    (``uv sync``: nothing is downloaded), output unbuffered (logs arrive as written)."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = os.pathsep.join([str(bin_dir), *filter(None, [env.get("PATH")])])
    env.update(FLOWER_TELEMETRY_OFF)
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def write_cli_config(home: Path, connection: str, address: str, ca_cert: Path) -> None:
    """``home/config.toml`` for the ``flwr`` CLI (``FLWR_HOME=home``): ``connection`` is
    the default, the SuperLink's Control API at ``address`` over TLS trusting ``ca_cert``."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        "[superlink]\n"
        f'default = "{connection}"\n\n'
        f"[superlink.{connection}]\n"
        f'address = "{address}"\n'
        f"root-certificates = {json.dumps(str(ca_cert))}\n",
        encoding="utf-8",
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write the flwr CLI's config.toml.")
    parser.add_argument("--home", type=Path, required=True, help="FLWR_HOME")
    parser.add_argument("--connection", required=True, help="the connection's name")
    parser.add_argument("--address", required=True, help="the SuperLink's Control API")
    parser.add_argument("--ca", type=Path, required=True, help="the CA certificate it trusts")
    args = parser.parse_args(argv)
    if not _KEY.fullmatch(args.connection):
        parser.error(f"--connection {args.connection!r} must match {_KEY.pattern}")
    write_cli_config(args.home, args.connection, args.address, args.ca)


if __name__ == "__main__":
    main()
