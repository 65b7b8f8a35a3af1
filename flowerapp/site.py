"""The site operator's one command: check the site's data file and the training plan it
approved, then run a SuperNode with fedsieve's ClientApp, TLS to the hub's SuperLink and
the site's key.

    fedsieve-site --data site.npz --plan plan.json --superlink hub.example.org:9092 \\
        --ca ca.crt --key site.key

The SuperNode connects outbound only (no port is opened to the outside: its ClientApp API
listens on 127.0.0.1, ``--clientappio-port``, one per site on a host) and retries for ever,
so a restarted hub finds it again. Data that cannot be trained on (a folder of images read
in the plan's schema, or an .npz), a plan file that cannot be read, a key or certificate
that cannot be loaded or a port in use ends here in one line with exit code 2, before
anything starts. Tasks whose settings are not the plan are refused (:mod:`flowerapp.plan`).
``--local-dp`` insists on local differential privacy whatever the plan says: a plan without
``privacy_mode: local`` is refused here, and so is every task without it
(:mod:`flowerapp.client_app`). The SuperNode runs watched (:mod:`flowerapp.supernode`): a
restart soon after a crash waits for the hub to let the node in again, and a hub that
refuses the site (its key, its certificate) ends it in one line with its own exit code.
It runs with Flower's telemetry and update check off, downloading nothing.

Beside the SuperNode it keeps the site's warm trainer running (:mod:`flowerapp.trainer`):
one process holding the engine, the site's data and the plan across rounds and runs, which
each message's ClientApp hands its task to over a Unix socket in a private temporary
directory (removed when the site stops). It starts once the hub has let the node in, and
again whenever it exits.
"""

from __future__ import annotations

import argparse
import socket
import ssl
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key

from config.environment import image_cache_dir
from federated.own_data import Reading
from flowerapp.flwr_config import config_pairs, flower_env
from flowerapp.plan import PlanError, plan_digest, read_plan
from flowerapp.site_data import SiteDataError, load_site_data
from flowerapp.supernode import EXIT_CODES, EXIT_TLS, EXIT_USAGE, Site, run_supernode
from flowerapp.task import SiteTask, TaskError
from flowerapp.trainer import KeptTrainer, prepare_dir, trainer_command

__all__ = ["main", "supernode_command"]


def supernode_command(
    data: Path, plan: Path, superlink: str, ca: Path, key: Path, clientappio_port: int = 9094,
    local_dp: bool = False, folders: Mapping[str, Path] | None = None,
) -> list[str]:  # fmt: skip
    """``flower-supernode`` with TLS (the hub's CA), SuperNode authentication (the site's
    private key; its public key is registered at the hub), and the data file, approved
    plan and the site's ``folders`` (``trainer-dir``: the warm trainer's; ``state-dir``:
    its own state, SCAFFOLD's variate) as node config."""
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
            | {name: str(folder.resolve()) for name, folder in (folders or {}).items()}
        )),
    ]  # fmt: skip


def credentials_problem(ca: Path, key: Path) -> str | None:
    """Why ``--ca`` or ``--key`` cannot be used (None: both load), in one line: Flower would
    say so only with a traceback."""
    try:
        x509.load_pem_x509_certificates(ca.read_bytes())
    except OSError as error:
        return f"--ca {ca}: {error.strerror}"
    except ValueError:
        return f"--ca {ca}: not a PEM certificate (the hub's ca.crt)"
    try:
        private = load_ssh_private_key(key.read_bytes(), None)
    except OSError as error:
        return f"--key {key}: {error.strerror}"
    except (ValueError, TypeError, UnsupportedAlgorithm):
        private = None
    if not isinstance(private, ec.EllipticCurvePrivateKey):
        return (
            f"--key {key}: not an unencrypted OpenSSH EC private key "
            "(python -m flowerapp.certs --no-tls --site NAME writes one)"
        )
    return None


def hub_certificate_problem(superlink: str, ca: Path, timeout: float = 10.0) -> str | None:
    """Why the hub's certificate cannot be trusted for ``superlink`` (None: it can, or the
    hub does not answer yet, which the SuperNode retries): one TLS handshake verifying
    the chain against ``--ca`` and the host name. Flower's SuperNode would only retry a
    host name the certificate was not issued for, without end."""
    host, _, port = superlink.rpartition(":")
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2"])  # as a gRPC client
    try:
        with (
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host.strip("[]")),
        ):
            return None
    except ssl.SSLCertVerificationError as error:
        return (
            f"TLS to {superlink} failed ({error.verify_message}): the hub's certificate is "
            f"not signed by --ca {ca}, or not issued for the host name {host}"
        )
    except (OSError, ValueError):  # not answering yet, or no TLS talk: the SuperNode says
        return None


def port_problem(port: int) -> str | None:
    """Why the SuperNode cannot listen on 127.0.0.1:``port`` (None: it can)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC: TIME_WAIT is no use
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as error:
            return (
                f"--clientappio-port {port}: {error.strerror} (another site on this host? "
                "give each its own port)"
            )
    return None


def _epilog() -> str:
    return "exit codes: " + "; ".join(f"{code} {what}" for code, what in EXIT_CODES.items())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fedsieve-site", description=__doc__.split("\n\n")[0], epilog=_epilog()
    )
    parser.add_argument(
        "--data", type=Path, required=True,
        help="the site's images or volumes: a folder with labels.csv (file, label[, split]) "
        "or an .npz",
    )  # fmt: skip
    parser.add_argument(
        "--plan", type=Path, required=True, help="the training plan this site approved (plan.json)"
    )
    parser.add_argument("--superlink", required=True, help="the hub's Fleet API, host:port")
    parser.add_argument("--ca", type=Path, required=True, help="the hub's CA certificate")
    parser.add_argument("--key", type=Path, required=True, help="the site's private key")
    parser.add_argument(
        "--clientappio-port", type=int, default=9094,
        help="the SuperNode's ClientApp API on 127.0.0.1 (one per site on a host)",
    )  # fmt: skip
    parser.add_argument(
        "--local-dp", action="store_true",
        help="train only with local differential privacy (privacy_mode local), plan or no plan",
    )  # fmt: skip
    parser.add_argument(
        "--state", type=Path,
        help="the site's own state folder, kept across restarts (SCAFFOLD's control variate; "
        "a plan with scaffold: true needs it)",
    )  # fmt: skip
    parser.add_argument(
        "--rejoin-timeout", type=float, default=120.0,
        help="seconds to wait for the hub to let this site's node in again after a restart",
    )  # fmt: skip
    parser.add_argument(
        "--check", action="store_true",
        help="check the data, plan, key and certificate, print the counts to register, and exit",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        plan = read_plan(args.plan)
        task = SiteTask.from_config(plan)
        reading = Reading(cache=image_cache_dir(), progress=sys.stderr.isatty())
        data = load_site_data(args.data, task.dataset_info(), reading)
        data.check_fits(
            channels=task.channels, size=task.size, classes=task.classes,
            multi_label=task.multi_label, spatial_dims=task.spatial_dims,
        )  # fmt: skip
    except (SiteDataError, PlanError, TaskError) as error:
        if isinstance(error, TaskError):
            error = PlanError(f"plan {args.plan}: not a training plan ({error})")
        print(f"fedsieve-site: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.local_dp and task.privacy_mode != "local":
        print(
            f"fedsieve-site: error: --local-dp: plan {args.plan} has privacy_mode "
            f"{task.privacy_mode}; this site trains only with privacy_mode local",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if task.scaffold and args.state is None:
        print(
            f"fedsieve-site: error: plan {args.plan} has scaffold: true: this site keeps its "
            "control variate in its own state folder; give --state DIR",
            file=sys.stderr,
        )
        return EXIT_USAGE
    problem = credentials_problem(args.ca, args.key) or port_problem(args.clientappio_port)
    if problem:
        print(f"fedsieve-site: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    counts = (
        f"fedsieve-site: {data.path.name}: {len(data.train)} training, {len(data.test)} test and "
        f"{len(data.val)} validation {'volumes' if task.spatial_dims == 3 else 'images'} fit "
        f"the approved plan {plan_digest(plan)[:12]}"
    )
    if data.size_note:
        counts += f"; {data.size_note}"
    if args.check:  # what the hub registers as this site's samples
        print(f"{counts}; register samples: {len(data.train)}")
        return 0
    print(f"{counts}; connecting to {args.superlink}", file=sys.stderr)
    problem = hub_certificate_problem(args.superlink, args.ca)
    if problem:
        print(f"fedsieve-site: error: {problem}", file=sys.stderr)
        return EXIT_TLS
    with tempfile.TemporaryDirectory(prefix="fedsieve-site-") as private:
        trainer_dir = Path(private)
        prepare_dir(trainer_dir)
        folders = {"trainer-dir": trainer_dir} | ({"state-dir": args.state} if args.state else {})
        command = supernode_command(
            data.path, args.plan, args.superlink, args.ca, args.key, args.clientappio_port,
            args.local_dp, folders,
        )  # fmt: skip
        env = flower_env(Path(command[0]).parent)
        trainer = KeptTrainer(
            trainer_command(trainer_dir, data.path.resolve(), args.plan.resolve()), env, sys.stderr
        )
        try:
            site = Site(args.superlink, args.ca, args.key)
            return run_supernode(
                command, env, site, rejoin_timeout=args.rejoin_timeout,
                on_joined=trainer.start, on_ended=trainer.stop,
            )  # fmt: skip
        finally:
            trainer.stop()


def console() -> None:
    sys.exit(main())


if __name__ == "__main__":
    console()
