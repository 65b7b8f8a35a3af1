# fedsieve: one image for the pipeline, its Prefect worker and the MLflow / Prefect servers.
#
#   docker build -t fedsieve:cpu .                                    # CPU (default)
#   docker build --build-arg TORCH_VARIANT=cuda -t fedsieve:cuda .    # CUDA
#   docker run --rm fedsieve:cpu                                      # = fedsieve run
#   docker run --rm --gpus all fedsieve:cuda run --set train.device=cuda
#
# The image installs the project with `make setup` itself, so it gets exactly the steps
# (and pins) that CI proves on the host. The two variants differ only in where torch
# comes from: PyPI's Linux wheel bundles the CUDA runtime (the host needs just the NVIDIA
# driver and the NVIDIA container toolkit); the CPU variant adds PyTorch's CPU index, whose
# torch==2.13.0+cpu wheel satisfies the same pin at a tenth of the size.
FROM python:3.11-slim

ARG TORCH_VARIANT=cpu
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu

LABEL org.opencontainers.image.title="fedsieve" \
      org.opencontainers.image.description="Federated learning on MedMNIST, orchestrated by Prefect, tracked in MLflow"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    DO_NOT_TRACK=true \
    MLFLOW_DISABLE_TELEMETRY=true \
    DVC_NO_ANALYTICS=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# make runs the setup target. The CUDA variant also gets a C compiler: Triton (in PyTorch's
# CUDA wheel; it runs the aggregation rules' GPU kernels) builds a small C launcher per
# kernel on first use, and without one the rules fall back to their slower torch path.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends make \
        $(if [ "$TORCH_VARIANT" = cuda ]; then echo gcc libc6-dev; fi) \
    && rm -rf /var/lib/apt/lists/*

# A non-root user owns the project and the servers' state directories (named volumes
# mounted there start with this ownership).
RUN groupadd --system --gid 10001 fedsieve \
    && useradd --system --uid 10001 --gid fedsieve --create-home --home-dir /home/fedsieve fedsieve \
    && mkdir -p /app /srv/mlflow /srv/prefect \
    && chown fedsieve:fedsieve /app /srv/mlflow /srv/prefect

WORKDIR /app
COPY --chown=10001:10001 . /app
USER 10001:10001

# `make setup`: the venv in /app/.venv, torch, the pinned stack with the project, medmnist.
RUN case "$TORCH_VARIANT" in \
        cpu) export PIP_EXTRA_INDEX_URL="$TORCH_CPU_INDEX" ;; \
        cuda) ;; \
        *) echo "TORCH_VARIANT must be cpu or cuda, not '$TORCH_VARIANT'" >&2; exit 1 ;; \
    esac \
    && make setup \
    && mkdir -p data reports artifacts .prefect

# PREFECT_HOME in the project, as the Makefile has it; FEDSIEVE_HOME is where prefect.yaml's
# pull step finds the checkout when this container runs a Prefect worker.
ENV PATH=/app/.venv/bin:$PATH \
    PREFECT_HOME=/app/.prefect \
    FEDSIEVE_HOME=/app

# The default command is a batch run; a container running a service (MLflow, Prefect
# server, a worker started --with-healthcheck) sets FEDSIEVE_HEALTH_URL to its health URL.
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; url = os.environ.get('FEDSIEVE_HEALTH_URL'); sys.exit(0 if not url else urllib.request.urlopen(url, timeout=5).status != 200)"]

ENTRYPOINT ["fedsieve"]
CMD ["run"]
