"""Flower's two small configuration formats, written in one place: the ``key=value``
pairs of ``--node-config`` / ``--run-config`` (TOML values), and the ``flwr`` CLI's
``config.toml`` naming a SuperLink connection. The site command, the hub's train stage,
the loopback harness and the container smoke test all write them through here."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ConfigValue", "config_pairs", "write_cli_config"]

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
