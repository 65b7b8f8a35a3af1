# fedsieve: one image for the pipeline, its Prefect worker and the MLflow / Prefect servers.
#
#   docker build -t fedsieve:cpu .                                    # CPU (default)
#   docker build --build-arg TORCH_VARIANT=cuda -t fedsieve:cuda .    # CUDA
#   docker run --rm -v fedsieve-data:/app/data -v fedsieve-reports:/app/reports \
#       -v fedsieve-artifacts:/app/artifacts -v fedsieve-tracking:/app/tracking fedsieve:cpu
#   docker run --rm --gpus all ... fedsieve:cuda run --set train.device=cuda
#
# Two stages. The build stage installs with the Makefile's own steps (`make deps
# project`: the same pins CI proves on the host; the editable install needs only
# pyproject.toml) before the source is copied, so the environment's layers do not change
# with the source. The runtime stage copies the finished virtual environment and the
# source as two layers, so a source edit ships megabytes, not the environment; no make,
# compilers or dev tools (pytest, ruff, hadolint: `make setup` adds those on a
# developer's machine).
#
# The variants differ only in where torch comes from: PyPI's Linux wheel bundles the CUDA
# 13 runtime (the host needs the NVIDIA driver 580 or newer and the NVIDIA container
# toolkit); the CPU variant adds PyTorch's CPU index, whose torch==2.13.0+cpu wheel
# satisfies the same pin at a tenth of the size, and the build fails if any other torch
# build was installed (an unreachable index would otherwise fall back to the CUDA wheel).
ARG TORCH_VARIANT=cpu

FROM python:3.11-slim AS build
ARG TORCH_VARIANT
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
# a local mirror of that index over plain http needs its host named here
ARG PIP_TRUSTED_HOST=""
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN case "$TORCH_VARIANT" in \
        cpu|cuda) ;; \
        *) echo "TORCH_VARIANT must be cpu or cuda, not '$TORCH_VARIANT'" >&2; exit 1 ;; \
    esac
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends make \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
ENV PIP_NO_CACHE_DIR=1
# The dependencies: only what they are read from, so source edits keep this layer.
COPY Makefile pyproject.toml ./
RUN if [ "$TORCH_VARIANT" = cpu ]; then export PIP_EXTRA_INDEX_URL="$TORCH_CPU_INDEX"; fi \
    && make deps project flower-cli \
    && .venv/bin/python -c "import sys, torch; variant = sys.argv[1]; cuda = torch.version.cuda; \
sys.exit(f'TORCH_VARIANT={variant} but torch {torch.__version__} was installed (CUDA {cuda}): ' \
'the CPU index was not used; check TORCH_CPU_INDEX') if (variant == 'cpu') == bool(cuda) else None" \
        "$TORCH_VARIANT"
COPY . .
# The folders a run writes are open to any uid (sticky, as /tmp is), so that `docker run
# --user $(id -u):$(id -g)` with a host folder mounted for results runs as the folder's
# owner, its other volumes and Prefect's home writable too (docs/container.md).
RUN mkdir -p data reports artifacts tracking .prefect \
    && chmod 1777 data reports artifacts tracking .prefect \
    && mkdir /source && tar -C /app --exclude=./.venv --exclude=./.venv-flower-cli -c . | tar -C /source -x


FROM python:3.11-slim
ARG TORCH_VARIANT

LABEL org.opencontainers.image.title="fedsieve" \
      org.opencontainers.image.description="Federated learning on MedMNIST, orchestrated by Prefect, tracked in MLflow"

# The CUDA variant gets a C compiler: Triton (in PyTorch's CUDA wheel; it runs the
# aggregation rules' GPU kernels) builds a small C launcher per kernel on first use, and
# without one the rules fall back to their slower torch path.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN if [ "$TORCH_VARIANT" = cuda ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends gcc libc6-dev \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && groupadd --system --gid 10001 fedsieve \
    && useradd --system --uid 10001 --gid fedsieve --create-home --home-dir /home/fedsieve fedsieve \
    && mkdir -p /srv/mlflow /srv/prefect \
    && chown fedsieve:fedsieve /srv/mlflow /srv/prefect

COPY --from=build --chown=10001:10001 /app/.venv /app/.venv
COPY --from=build --chown=10001:10001 /app/.venv-flower-cli /app/.venv-flower-cli
COPY --from=build --chown=10001:10001 /source /app
WORKDIR /app
USER 10001:10001

# HOME and USER hold for any uid (`docker run --user`, no passwd entry: matplotlib's and
# medmnist's caches, MLflow's user tag). PREFECT_HOME in the project, as the Makefile has
# it; FEDSIEVE_HOME is where prefect.yaml's pull step finds the checkout when this
# container runs a Prefect worker; FEDSIEVE_FLOWER_BIN holds the `flwr` CLI with which it
# trains at real sites (runtime: flower), last on PATH (the operator's `flwr supernode
# register` in the worker). The tracking store is a file in /app/tracking (its artifacts
# beside it), so one volume keeps every run; a tracking server is one MLFLOW_TRACKING_URI
# away. No git in the image: MLflow's GitPython stays quiet about it
# (GIT_PYTHON_REFRESH=quiet, as MLflow documents). The last five before NVIDIA's pin the
# CPU numerics (config/environment.py): the same bits on any x86-64 host with AVX2;
# `docker run -e FEDSIEVE_PORTABLE_NUMERICS=0` gives them up.
ENV PATH=/app/.venv/bin:$PATH:/app/.venv-flower-cli/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    USER=fedsieve \
    PREFECT_HOME=/app/.prefect \
    FEDSIEVE_HOME=/app \
    FEDSIEVE_FLOWER_BIN=/app/.venv-flower-cli/bin \
    MLFLOW_TRACKING_URI=sqlite:////app/tracking/mlflow.db \
    GIT_PYTHON_REFRESH=quiet \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    DO_NOT_TRACK=true \
    MLFLOW_DISABLE_TELEMETRY=true \
    DVC_NO_ANALYTICS=1 \
    FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_UPDATE_CHECK=1 \
    MLFLOW_HTTP_REQUEST_MAX_RETRIES=3 \
    MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR=1 \
    MLFLOW_HTTP_REQUEST_TIMEOUT=30 \
    ATEN_CPU_CAPABILITY=avx2 \
    ONEDNN_MAX_CPU_ISA=AVX2 \
    MKL_CBWR=COMPATIBLE \
    MKL_DYNAMIC=FALSE \
    OMP_NUM_THREADS=2 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# What must outlive a container: the data cache, the reports, the artifacts (checkpoints,
# grid cells) and the tracking store.
VOLUME ["/app/data", "/app/reports", "/app/artifacts", "/app/tracking"]

# The default command is a batch run; a container running a service (MLflow, Prefect
# server, a worker started --with-healthcheck) sets FEDSIEVE_HEALTH_URL to its health URL.
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; url = os.environ.get('FEDSIEVE_HEALTH_URL'); sys.exit(0 if not url else urllib.request.urlopen(url, timeout=5).status != 200)"]

ENTRYPOINT ["fedsieve"]
CMD ["run"]
