#!/usr/bin/env bash
# The container, end to end, as a new user runs it (docs/container.md):
#   1. build the CPU image;
#   2. run the default pipeline (3 rounds) with data, reports, artifacts and tracking in
#      volumes, and check reports/metrics.json and the MLflow run in the tracking volume;
#   3. results in host folders: a folder Docker made (root's) refused in one line before
#      anything runs; `--user` with the folders' owner writes its reports and tracking there;
#   4. bring the compose stack up (PostgreSQL, MLflow, Prefect, the deployments, a
#      worker), run a two-round deployment with docs/container.md's command (the image's
#      own `prefect`, in the worker: a host with only Docker has no other), check the run
#      is FINISHED in the MLflow server and its model the champion;
#   5. start the `model` service and call it over HTTP (scripts/container_model.py): a PNG
#      and a DICOM file in JSON and in Parquet, answered alike; a path refused in one line;
#   6. load: a grid of 8 cells at once beside 2 deployment runs (scripts/container_load.py):
#      no run or metric lost, no database-lock error on the console;
#   7. tear everything down (also on failure).
# Every run trains at least two rounds: the gate registers no model that is no better than
# a constant predictor, and BreastMNIST's one-round model is not (test AUC 0.454 at the
# default seed; two rounds: 0.79, three: 0.60).
# Needs a running Docker engine and Compose (v2 `docker compose` or v1.28+
# `docker-compose`); not part of `make test`. Prints each step's wall time.
#
# Environment: DOCKER_BUILD_ARGS (extra `docker build` arguments, e.g. a local torch
# index), DOCKER_NETWORK (default: host when the engine has no bridge network, else the
# default), MEDMNIST_ROOT (mount these official files read-only instead of downloading).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! docker info >/dev/null 2>&1; then
    echo "container-smoke: no Docker engine answers (docker info failed); start one first" >&2
    exit 2
fi
if docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null; then
    COMPOSE=(docker-compose)
else
    echo "container-smoke: neither 'docker compose' nor 'docker-compose' is installed" >&2
    exit 2
fi

PROJECT=fedsieve-smoke
# The servers' credentials (docker-compose.yml refuses to start without them): an .env's,
# else random ones for this run; the client steps below get them as the worker does.
for secret in FEDSIEVE_PREFECT_AUTH FEDSIEVE_MLFLOW_PASSWORD FEDSIEVE_MLFLOW_SECRET_KEY; do
    if [ -z "${!secret:-}" ]; then
        value=$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')
        [ "$secret" = FEDSIEVE_PREFECT_AUTH ] && value="fedsieve:$value"
        export "$secret=$value"
    fi
done
# The client steps also get the retries docker-compose.yml gives every client of the
# stack (x-clients): its Prefect server answered one poll of the load step's dispatched
# grid with a 500 on a loaded 2-core machine, which ended the smoke (cause not found: the
# stack's logs went with its teardown).
CLIENT_ENV=(-e PREFECT_API_AUTH_STRING="$FEDSIEVE_PREFECT_AUTH" -e MLFLOW_TRACKING_USERNAME=fedsieve
            -e MLFLOW_TRACKING_PASSWORD="$FEDSIEVE_MLFLOW_PASSWORD"
            -e PREFECT_CLIENT_MAX_RETRIES=6 -e PREFECT_CLIENT_RETRY_EXTRA_CODES=500
            -e MLFLOW_HTTP_REQUEST_MAX_RETRIES=7 -e MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR=1)
VOLUMES=(data reports artifacts tracking)
NETWORK=()
if ! docker network inspect bridge >/dev/null 2>&1 || [ "${DOCKER_NETWORK:-}" = host ]; then
    NETWORK=(--network host)
fi
COMPOSE_FILES=(-f docker-compose.yml)
if [ ${#NETWORK[@]} -gt 0 ]; then  # an engine without a bridge: services on the host network
    HOST_COMPOSE=$(mktemp --suffix=.yml)
    python3 scripts/compose_host_network.py "$HOST_COMPOSE"
    COMPOSE_FILES=(-f "$HOST_COMPOSE")
fi
if [ -n "${MEDMNIST_ROOT:-}" ]; then  # the worker reads these files instead of downloading
    DATA_COMPOSE=$(mktemp --suffix=.yml)
    printf 'services:\n  worker:\n    environment: {MEDMNIST_ROOT: /medmnist}\n    volumes: ["%s:/medmnist:ro"]\n' \
        "$MEDMNIST_ROOT" > "$DATA_COMPOSE"
    COMPOSE_FILES+=(-f "$DATA_COMPOSE")
fi

HOST_DIR=$(mktemp -d)  # host folders for results (step 3)
cleanup() {
    exit_status=$?
    if [ "$exit_status" -ne 0 ] && [ -n "$("${COMPOSE[@]}" -p "$PROJECT" "${COMPOSE_FILES[@]}" ps -q 2>/dev/null)" ]; then
        # the stack's logs outlive its teardown, so that a failure's cause can be read
        STACK_LOG=$(mktemp --tmpdir fedsieve-container-smoke.XXXXXX.log)
        "${COMPOSE[@]}" -p "$PROJECT" "${COMPOSE_FILES[@]}" logs --no-color --timestamps >"$STACK_LOG" 2>&1 || true
        echo "container-smoke: failed (exit $exit_status); the stack's logs are in $STACK_LOG" >&2
    fi
    "${COMPOSE[@]}" -p "$PROJECT" "${COMPOSE_FILES[@]}" down --volumes --remove-orphans \
        >/dev/null 2>&1 || true
    rm -rf "$HOST_DIR" "${HOST_COMPOSE:-}" "${DATA_COMPOSE:-}"
    for volume in "${VOLUMES[@]}"; do docker volume rm -f "$PROJECT-$volume" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT

step() { STEP_NAME=$1; STEP_START=$(date +%s); echo "== $1"; }
done_step() { echo "   $STEP_NAME: $(($(date +%s) - STEP_START)) s"; }

step "build fedsieve:cpu"
# shellcheck disable=SC2086
docker build "${NETWORK[@]}" ${DOCKER_BUILD_ARGS:-} -t fedsieve:cpu .
done_step
echo "   image size: $(docker image inspect fedsieve:cpu --format '{{.Size}}' | awk '{printf "%.2f GB", $1 / 1e9}')"

step "docker run: the default pipeline, 3 rounds, everything in volumes"
MOUNTS=()
for volume in "${VOLUMES[@]}"; do MOUNTS+=(-v "$PROJECT-$volume:/app/$volume"); done
if [ -n "${MEDMNIST_ROOT:-}" ]; then
    MOUNTS+=(-v "$MEDMNIST_ROOT:/medmnist:ro" -e MEDMNIST_ROOT=/medmnist)
fi
docker run --rm "${NETWORK[@]}" "${MOUNTS[@]}" fedsieve:cpu run --set train.rounds=3
done_step
docker run --rm "${MOUNTS[@]}" --entrypoint python fedsieve:cpu -c '
import json, sys
from mlflow import MlflowClient
metrics = json.load(open("reports/metrics.json"))
assert metrics["rounds"] == 3, metrics
client = MlflowClient()
[run] = client.search_runs([client.get_experiment_by_name("fedsieve").experiment_id])
assert run.info.status == "FINISHED", run.info.status
auc = metrics["test_auc"]
print(f"   reports/metrics.json: test AUC {auc:.3f}; MLflow run {run.info.run_id} FINISHED in the tracking volume")
'

step "results in host folders: one the container cannot write refused in one line; --user works"
DATA_MOUNT=()
if [ -n "${MEDMNIST_ROOT:-}" ]; then DATA_MOUNT=(-v "$MEDMNIST_ROOT:/medmnist:ro" -e MEDMNIST_ROOT=/medmnist); fi
set +e  # Docker creates a missing host folder as root's: the image's user cannot write it
refused=$(docker run --rm "${NETWORK[@]}" -v "$HOST_DIR/made-by-docker:/app/reports" "${DATA_MOUNT[@]}" \
    fedsieve:cpu run --set train.rounds=1 2>&1)
status=$?
set -e
if [ "$status" -ne 2 ] || [ "$(printf '%s\n' "$refused" | wc -l)" -ne 1 ] \
        || ! grep -q '^fedsieve: error: reports/ (/app/reports) cannot be written by uid 10001' <<<"$refused"; then
    echo "container-smoke: a root-owned results folder was not refused in one line (exit $status):" >&2
    echo "$refused" >&2
    exit 1
fi
OWNER="$(id -u):$(id -g)"
[ "$(id -u)" = 0 ] && OWNER=1000:1000  # root owns everything: take an ordinary user's ids
mkdir -p "$HOST_DIR/mine/reports" "$HOST_DIR/mine/tracking" && chown -R "$OWNER" "$HOST_DIR/mine"
docker run --rm "${NETWORK[@]}" --user "$OWNER" -v "$HOST_DIR/mine/reports:/app/reports" \
    -v "$HOST_DIR/mine/tracking:/app/tracking" "${DATA_MOUNT[@]}" fedsieve:cpu run --set train.rounds=2
if [ "$(stat -c %u:%g "$HOST_DIR/mine/reports/metrics.json")" != "$OWNER" ] || [ ! -s "$HOST_DIR/mine/tracking/mlflow.db" ]; then
    echo "container-smoke: --user $OWNER did not leave its reports and tracking store in the host folders" >&2
    exit 1
fi
echo "   refused: ${refused#fedsieve: error: }"
echo "   --user $OWNER: reports/metrics.json and tracking/mlflow.db in the host folders, owned by $OWNER"
done_step

step "compose: PostgreSQL and the servers healthy, deployments registered, worker up"
# the worker waits for PostgreSQL, the servers' health and the deploy service's success
"${COMPOSE[@]}" -p "$PROJECT" "${COMPOSE_FILES[@]}" up -d worker
done_step

step "a two-round deployment run on the worker, started as docs/container.md says"
# the image's own prefect, in the worker (its server address and credentials set there)
deployed=$(timeout 900 "${COMPOSE[@]}" -p "$PROJECT" "${COMPOSE_FILES[@]}" exec -T worker \
    prefect deployment run pipeline-from-file/fedsieve --param 'overrides=["train.rounds=2"]' \
    --watch 2>&1) || { echo "container-smoke: the deployment run failed:" >&2; echo "$deployed" >&2; exit 1; }
FLOW_RUN=$(grep -oE 'UUID: [0-9a-f-]{36}' <<<"$deployed" | head -1 | cut -d' ' -f2)
docker run --rm --network host "${CLIENT_ENV[@]}" -e MLFLOW_TRACKING_URI=http://127.0.0.1:5000 \
    -e FLOW_RUN="$FLOW_RUN" --entrypoint python fedsieve:cpu -c '
import os
from mlflow import MlflowClient
client = MlflowClient()
flow_run = os.environ["FLOW_RUN"]
[own] = client.search_runs([client.get_experiment_by_name("fedsieve").experiment_id],
                           f"tags.prefect_flow_run_id = \"{flow_run}\"")  # its own, not the newest
assert own.info.status == "FINISHED", own.info.status
champion = client.get_model_version_by_alias("fedsieve-breastmnist", "champion")
assert champion.run_id == own.info.run_id, (champion.run_id, own.info.run_id)
print(f"   flow run {flow_run} completed; its MLflow run {own.info.run_id} FINISHED on the "
      f"server, its model version {champion.version} the champion")
'
done_step

step "the model service: the champion over HTTP (PNG, DICOM, Parquet; a path refused)"
"${COMPOSE[@]}" -p "$PROJECT" "${COMPOSE_FILES[@]}" up -d model
MODEL_CONTAINER=$("${COMPOSE[@]}" -p "$PROJECT" "${COMPOSE_FILES[@]}" ps -q model)
deadline=$(($(date +%s) + 600))
until [ "$(docker inspect -f '{{.State.Health.Status}}' "$MODEL_CONTAINER")" = healthy ]; do
    if [ "$(date +%s)" -gt "$deadline" ]; then
        echo "container-smoke: the model service is not healthy after 600 s:" >&2
        "${COMPOSE[@]}" -p "$PROJECT" "${COMPOSE_FILES[@]}" logs --no-color --tail 40 model >&2
        exit 1
    fi
    sleep 5
done
docker run --rm --network host "${MOUNTS[@]}" -v "$PWD/scripts:/smoke:ro" \
    --entrypoint python fedsieve:cpu /smoke/container_model.py
done_step
step "load: a grid of 8 cells at once beside 2 deployment runs, against the stack"
docker run --rm --network host -e PREFECT_API_URL=http://127.0.0.1:4200/api "${CLIENT_ENV[@]}" \
    -e MLFLOW_TRACKING_URI=http://127.0.0.1:5000 "${MOUNTS[@]}" -v "$PWD/scripts:/smoke:ro" \
    --entrypoint python fedsieve:cpu /smoke/container_load.py
done_step
step "the servers' and the worker's logs: no traceback"
LOGS=$("${COMPOSE[@]}" -p "$PROJECT" "${COMPOSE_FILES[@]}" logs --no-color worker mlflow prefect-server 2>&1)
if grep -q "Traceback" <<<"$LOGS"; then
    echo "container-smoke: a traceback in the stack's logs:" >&2
    grep -A 20 -m 3 "Traceback" <<<"$LOGS" >&2
    exit 1
fi
echo "   $(wc -l <<<"$LOGS") log lines, no traceback"
done_step
echo "container-smoke: all steps passed"
