"""The site operator's one command: check the site's data file and the training plan it
approved, then run a SuperNode with fedsieve's ClientApp, TLS to the hub's SuperLink and
the site's key.

    fedsieve-site --data site.npz --plan plan.json --superlink hub.example.org:9092 \\
        --ca ca.crt --key site.key

The SuperNode connects outbound only (no port is opened to the outside: its ClientApp API
listens on 127.0.0.1) and retries for ever, so a restarted hub finds it again. A data file
that cannot be trained on, or a plan file that cannot be read, ends here in one line with exit
code 2, before anything starts. Tasks whose settings are not the plan are refused
(:mod:`flowerapp.plan`). ``--local-dp`` insists on local differential privacy whatever
the plan says: a plan without ``privacy_mode: local`` is refused here, and so is every
task without it (:mod:`flowerapp.client_app`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from flowerapp.flwr_config import config_pairs
from flowerapp.plan import PlanError, plan_digest, read_plan
from flowerapp.site_data import SiteDataError, load_site_data, task_dataset

__all__ = ["main", "supernode_command"]


def supernode_command(
    data: Path, plan: Path, superlink: str, ca: Path, key: Path, clientappio_port: int = 9094,
    local_dp: bool = False,
) -> list[str]:  # fmt: skip
    """``flower-supernode`` with TLS (the hub's CA), SuperNode authentication (the site's
    private key; its public key is registered at the hub), and the data file and approved
    plan as node config."""
    binary = Path(sys.executable).parent / "flower-supernode"
    return [
        str(binary),
        "--superlink", superlink,
        "--root-certificates", str(ca),
        "--auth-supernode-private-key", str(key),
        "--isolation", "subprocess",
        "--clientappio-api-address", f"127.0.0.1:{clientappio_port}",
        "--node-config", " ".join(config_pairs(
            {"data-file": str(data.resolve()), "approved-plan": str(plan.resolve())}
            | ({"require-local-dp": True} if local_dp else {})
        )),
    ]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedsieve-site", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", type=Path, required=True,
        help="the site's images: a folder with labels.csv (file, label[, split]) or an .npz",
    )  # fmt: skip
    parser.add_argument(
        "--plan", type=Path, required=True, help="the training plan this site approved (plan.json)"
    )
    parser.add_argument("--superlink", required=True, help="the hub's Fleet API, host:port")
    parser.add_argument("--ca", type=Path, required=True, help="the hub's CA certificate")
    parser.add_argument("--key", type=Path, required=True, help="the site's private key")
    parser.add_argument("--clientappio-port", type=int, default=9094)
    parser.add_argument(
        "--local-dp", action="store_true",
        help="train only with local differential privacy (privacy_mode local), plan or no plan",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        plan = read_plan(args.plan)
        data = load_site_data(args.data, task_dataset(plan))
        data.check_fits(
            channels=int(plan["channels"]), size=int(plan["size"]),
            classes=int(plan["classes"]), multi_label=bool(plan["multi_label"]),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as error:  # SiteDataError, PlanError, a bad plan
        if not isinstance(error, SiteDataError | PlanError):
            error = PlanError(f"plan {args.plan}: not a training plan ({error!r} missing or bad)")
        print(f"fedsieve-site: error: {error}", file=sys.stderr)
        return 2
    if args.local_dp and plan.get("privacy_mode") != "local":
        print(
            f"fedsieve-site: error: --local-dp: plan {args.plan} has privacy_mode "
            f"{plan.get('privacy_mode', 'off')}; this site trains only with privacy_mode local",
            file=sys.stderr,
        )
        return 2
    for name, path in (("--ca", args.ca), ("--key", args.key)):
        if not path.is_file():
            print(f"fedsieve-site: error: {name} {path}: no such file", file=sys.stderr)
            return 2
    print(
        f"fedsieve-site: {data.path.name}: {len(data.train)} training and {len(data.test)} "
        f"held-out images; approved plan {plan_digest(plan)[:12]}; connecting to {args.superlink}",
        file=sys.stderr,
    )
    command = supernode_command(
        data.path, args.plan, args.superlink, args.ca, args.key, args.clientappio_port,
        args.local_dp,
    )  # fmt: skip
    os.execv(command[0], command)  # the SuperNode is the site's process from here on


def console() -> None:
    sys.exit(main())


if __name__ == "__main__":
    console()
