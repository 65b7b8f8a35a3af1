"""docker-compose.yml (or the federation overlay) for an engine without a bridge network
(these machines: the smoke tests' host): every service on the host's network, servers
bound to 127.0.0.1, service names replaced by 127.0.0.1, no published ports (meaningless
there, and Compose v1 refuses them beside host networking).

    python scripts/compose_host_network.py OUT.yml [IN.yml, default docker-compose.yml]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
HOSTS = ("postgres:5432", "prefect-server:", "mlflow:")
SUPERLINK = re.compile(r"\bsuperlink:(\d+)")  # the worker's way to the SuperLink's Control API


def on_loopback(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: on_loopback(item) for key, item in value.items()}
    if isinstance(value, list):
        return [on_loopback(item) for item in value]
    if isinstance(value, str):
        for host in HOSTS:
            value = value.replace(f"@{host}", f"@127.0.0.1:{host.split(':')[1]}")
            value = value.replace(f"//{host}", "//127.0.0.1:")
        value = SUPERLINK.sub(r"127.0.0.1:\1", value)
        return value.replace("0.0.0.0", "127.0.0.1").replace("mlflow:*,", "")
    return value


def main() -> None:
    source = Path(sys.argv[2]) if len(sys.argv) > 2 else REPO / "docker-compose.yml"
    compose = yaml.safe_load(source.read_text())
    for name, service in compose["services"].items():
        service.pop("ports", None)
        service["network_mode"] = "host"
        if "build" in service:
            service["build"]["context"] = str(REPO)
        for index, volume in enumerate(service.get("volumes", [])):
            if volume.startswith("./"):
                service["volumes"][index] = str(REPO / volume[2:])
        compose["services"][name] = on_loopback(service)
    if "postgres" in compose["services"]:
        compose["services"]["postgres"]["command"] = [
            "postgres", "-c", "listen_addresses=127.0.0.1"
        ]  # fmt: skip
    Path(sys.argv[1]).write_text(yaml.safe_dump(compose, sort_keys=False))


if __name__ == "__main__":
    main()
