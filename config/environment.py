"""Process environment the project sets before Prefect/MLflow/DVC are imported, and the
tracking store it uses.

Telemetry off (each tool otherwise makes a network attempt), MLflow's HTTP client failing
within seconds rather than minutes, and PREFECT_HOME inside the project, unless the user
has set them. And portable CPU numerics (:data:`PORTABLE_NUMERICS`): the same params give
the same bits on any x86-64 machine with AVX2, unless ``FEDSIEVE_PORTABLE_NUMERICS=0``.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

__all__ = [
    "DEFAULT_TRACKING_URI",
    "FLOWER_TELEMETRY_OFF",
    "MLFLOW_SERVER_NO_JOBS",
    "PORTABLE_NUMERICS",
    "PORTABLE_NUMERICS_SWITCH",
    "configure_environment",
    "configure_numerics",
    "has_avx2_and_fma",
    "image_cache_dir",
    "portable_numerics_enabled",
    "tracking_uri",
]

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"

# Flower's own switches (flwr.supercore.telemetry, flwr.supercore.update_check): every
# Flower process (flwr CLI, SuperLink, SuperNode, SuperExec, ServerApp, ClientApp) reads
# them, and each process inherits them from the one that started it
FLOWER_TELEMETRY_OFF = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}

TELEMETRY_OFF = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "true",  # MLflow honours "true", not "1"
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    **FLOWER_TELEMETRY_OFF,
}

# MLflow's HTTP client retries 7 times with a backoff factor of 2 (minutes before a call to
# an unreachable tracking server gives up). The Tracker goes quiet after the first failure
# and reports/ keep everything, so fail within seconds instead: ~6 s for a closed port.
MLFLOW_HTTP_FAIL_FAST = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}

# For an `mlflow server` (the compose service, the servers the tests start): otherwise it
# starts a job runner and its huey consumers beside itself, for MLflow's GenAI jobs (prompt
# optimisation, scorers), which fedsieve does not use: about as much CPU again as the
# server's own while it idles (MLflow's own switch, read by the server). No fedsieve
# command starts an MLflow server, so configure_environment does not set it.
MLFLOW_SERVER_NO_JOBS = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


# Portable CPU numerics. Each library picks its kernels by the CPU it finds (AVX-512 where
# there is one), and a float sum's bits depend on the kernel and on how the work is split
# among threads: on one AVX2 machine, a lower ISA for ATen, oneDNN or MKL, or another
# thread count, each alone changed a short training run's bits (docs/configuration.md,
# "Portable numerics"). Each library reads its variable once, at first use (the OpenMP
# runtime when torch loads): they must be set before torch is imported.
PORTABLE_NUMERICS = {
    "ATEN_CPU_CAPABILITY": "avx2",  # PyTorch's own kernels: AVX2 also where AVX-512 is
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN (the convolutions)
    # MKL (matrix products): on non-Intel CPUs MKL honours only AUTO and COMPATIBLE, so an
    # AVX2 branch would be AMD's AUTO; COMPATIBLE is the one code path on Intel and AMD alike
    "MKL_CBWR": "COMPATIBLE",
    "MKL_DYNAMIC": "FALSE",  # MKL's conditions for reproducibility: a fixed thread count
    "OMP_NUM_THREADS": "2",  # reductions split by thread count: the same count everywhere
}
# ATen takes "avx2" without checking the CPU (one without AVX2 would fault; oneDNN's and
# MKL's settings are limits, safe anywhere): pinned only where AVX2 and FMA are present
UNCHECKED_PIN = "ATEN_CPU_CAPABILITY"
PORTABLE_NUMERICS_SWITCH = "FEDSIEVE_PORTABLE_NUMERICS"


def configure_environment(project: Path | None = None) -> None:
    for key, value in (TELEMETRY_OFF | MLFLOW_HTTP_FAIL_FAST).items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("PREFECT_HOME", str((project or Path.cwd()) / ".prefect"))
    # MLflow's bar for each model download (fedsieve predict, the gate): a log full of bars
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # A flow's temporary server may take a while on a cold, busy 2-core machine.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    configure_numerics()


def portable_numerics_enabled() -> bool:
    """On unless ``FEDSIEVE_PORTABLE_NUMERICS`` is 0 (or false, no, off)."""
    value = os.environ.get(PORTABLE_NUMERICS_SWITCH, "1")
    return value.strip().lower() not in {"0", "false", "no", "off"}


def configure_numerics() -> None:
    """:data:`PORTABLE_NUMERICS` set, over whatever the environment held (a site's
    ``OMP_NUM_THREADS`` would change the bits as surely as its CPU). Switched off, the
    values still equal to the pinned ones (from the image's ENV, a deployment's job
    variables) are cleared, and values of the user's own are kept."""
    pins = {
        key: value
        for key, value in PORTABLE_NUMERICS.items()
        if key != UNCHECKED_PIN or has_avx2_and_fma()
    }
    for key, value in pins.items():
        if portable_numerics_enabled():
            os.environ[key] = value
        elif os.environ.get(key) == value:
            del os.environ[key]


def has_avx2_and_fma() -> bool:
    """An x86-64 CPU whose flags (/proc/cpuinfo) include AVX2 and FMA."""
    if platform.machine().lower() not in {"x86_64", "amd64"}:
        return False
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    return {"avx2", "fma"} <= set(flags.split())


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` when set (a team server works unchanged), else the project's
    SQLite file."""
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


IMAGE_CACHE = "FEDSIEVE_CACHE"


def image_cache_dir(environ: dict[str, str] | None = None) -> Path | None:
    """Where own images are kept decoded (:mod:`federated.image_cache`): ``FEDSIEVE_CACHE``
    (``off``: nowhere), else ``$XDG_CACHE_HOME/fedsieve/images``, else
    ``~/.cache/fedsieve/images``, on the machine that reads them."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(IMAGE_CACHE, "").strip()
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen).expanduser()
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fedsieve" / "images"
