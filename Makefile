# fedsieve: `make setup`, then `make run` (the default pipeline on real data) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)

# Telemetry off (each tool otherwise makes a network attempt); Prefect's home in the project.
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := true
export MLFLOW_DISABLE_TELEMETRY := true
export DVC_NO_ANALYTICS := 1
export FLWR_TELEMETRY_ENABLED := 0
export FLWR_DISABLE_UPDATE_CHECK := 1
export PREFECT_HOME ?= $(CURDIR)/.prefect

# The official MedMNIST files beside the checkout (../shared) when present; otherwise
# params.yaml's data.root, downloaded on first use.
SHARED_DATA := $(abspath ../shared/data/medmnist)
ifneq ($(wildcard $(SHARED_DATA)/breastmnist.npz),)
export MEDMNIST_ROOT ?= $(SHARED_DATA)
endif

.PHONY: setup setup-flower browser deps deps-flower project project-flower flower-cli run test lint bench bench-aggregation bench-pretest bench-pid bench-speed \
	bench-flower bench-federation bench-overhead bench-numerics bench-fidelity bench-resnet18 bench-own-images bench-serving compose-env container-smoke container-faults federation-smoke clean

# The install recipe of ../shared/ENVIRONMENT.md, in order: torch first (the CPU wheel on
# these machines), the pinned stack (pyproject.toml's dependencies), medmnist without its
# torchvision dependency, then the project itself with the dev tools. The image runs the
# same steps, `deps project` (no dev tools), before the source is copied: the editable
# install needs only pyproject.toml, so source edits keep those layers. The two
# environments are independent and each install is mostly one core's work, so they are
# built at once, and the browser is installed in the slot the shorter one frees. The
# project's own modules are compiled once: processes that may not write bytecode
# (PYTHONDONTWRITEBYTECODE, set on these machines) read it instead of compiling.
setup:
	$(MAKE) --no-print-directory -j2 -Otarget deps setup-flower browser EXTRAS="hub dev"
	$(BIN)/pip install --disable-pip-version-check -q --config-settings editable_mode=compat -e ".[hub,dev]"
	$(BIN)/python -m compileall -q aggregation benchmarks config federated fedsieve flowerapp flows models registry tasks >/dev/null
	$(BIN)/python -c "import torch, prefect, mlflow, dvc, medmnist, fedsieve; print('fedsieve ready: torch', torch.__version__, '| prefect', prefect.__version__, '| mlflow', mlflow.__version__)"

# Headless Chromium for the MLflow UI check (tests/ops/test_mlflow_ui.py); best effort:
# only where apt-get runs as root, and the test says so when the browser is missing.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "chromium not installed: the MLflow UI check will be skipped"

# The pinned stack with the extras named (the image: the hub's; `make setup`: the dev
# tools too, resolved in the same install).
EXTRAS ?= hub
deps:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q torch==2.13.0
	$(BIN)/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print(*p["dependencies"], *(d for e in "$(EXTRAS)".split() for d in p["optional-dependencies"][e]), sep="\n")' > $(VENV)/requirements.txt
	$(BIN)/pip install --disable-pip-version-check -q -r $(VENV)/requirements.txt
	$(BIN)/pip install --disable-pip-version-check -q --no-deps medmnist==3.0.2

project:
	$(BIN)/pip install --disable-pip-version-check -q --no-deps --config-settings editable_mode=compat -e .

# Flower's own environment (its pins conflict with Prefect's): the engine, torch and Flower,
# what a site runs and what the hub's SuperLink runs its ServerApp in (docs/federation.md).
# The site image (Dockerfile.site) runs `deps-flower project-flower` before its source is
# copied: the editable install needs only pyproject.toml (its .pth names the folder).
FLOWER_VENV := .venv-flower
setup-flower: deps-flower project-flower
	$(FLOWER_VENV)/bin/python -c "import flwr, torch, flowerapp.client_app; print('Flower environment ready: flwr', flwr.__version__, '| torch', torch.__version__)"

project-flower:
	$(FLOWER_VENV)/bin/pip install --disable-pip-version-check -q --no-deps --config-settings editable_mode=compat -e .

deps-flower:
	test -x $(FLOWER_VENV)/bin/python || $(PYTHON) -m venv $(FLOWER_VENV)
	$(FLOWER_VENV)/bin/pip install --disable-pip-version-check -q torch==2.13.0
	$(FLOWER_VENV)/bin/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print(*p["dependencies"], *p["optional-dependencies"]["flower"], sep="\n")' > $(FLOWER_VENV)/requirements.txt
	$(FLOWER_VENV)/bin/pip install --disable-pip-version-check -q -r $(FLOWER_VENV)/requirements.txt
	$(FLOWER_VENV)/bin/pip install --disable-pip-version-check -q --no-deps medmnist==3.0.2

# The hub image's `flwr` CLI: Flower alone (no torch, no engine; its pins conflict with
# Prefect's), with which the hub's worker submits runs to its SuperLink (the compose
# stack's federation overlay, docs/federation.md). On a checkout `.venv-flower` has it.
FLOWER_CLI_VENV := .venv-flower-cli
flower-cli:
	test -x $(FLOWER_CLI_VENV)/bin/python || $(PYTHON) -m venv $(FLOWER_CLI_VENV)
	$(FLOWER_CLI_VENV)/bin/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print(*p["optional-dependencies"]["flower"], sep="\n")' > $(FLOWER_CLI_VENV)/requirements.txt
	$(FLOWER_CLI_VENV)/bin/pip install --disable-pip-version-check -q -r $(FLOWER_CLI_VENV)/requirements.txt

run:
	$(BIN)/fedsieve dvc repro

# Two workers (pytest-xdist), a group of tests per worker at a time (a file; the files on
# the session's loopback hub together: tests/conftest.py): most of the end-to-end tests
# wait on servers, processes and federations, so CI's two cores run two of them.
test:
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --no-loadscope-reorder --durations=40

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Benchmarks write benchmarks/results/*.json (device, versions, date). `bench` runs the
# quick ones; the fidelity grid and the ResNet-18 run take tens of minutes on a CPU.
bench: bench-aggregation bench-pretest bench-pid bench-speed bench-flower bench-overhead

bench-aggregation:
	$(BIN)/python -m benchmarks.speed.aggregation

bench-pretest:
	$(BIN)/python -m benchmarks.speed.pretest

bench-pid:
	$(BIN)/python -m benchmarks.speed.pid_cost

bench-speed:  # batched vs sequential rounds; on a GPU add --device cuda
	$(BIN)/python -m benchmarks.speed.round_speed

bench-flower:  # creates its own Flower venv (benchmarks/.venv-flower) on first use
	$(BIN)/python -m benchmarks.speed.flower_race --repeats 3

bench-federation:  # real sites on loopback (TLS, authentication) beside Flower's FedAvg; minutes
	$(BIN)/python -m benchmarks.sites.federation_loopback

bench-overhead:
	$(BIN)/python -m benchmarks.speed.overhead

bench-own-images:  # 20,000 DICOMs and PNGs written to a temporary folder (12 GB); minutes
	$(BIN)/python -m benchmarks.sites.own_images

bench-serving:  # the champion behind `mlflow models serve`, and a diverged run through the gate
	$(BIN)/python -m benchmarks.sites.serving

bench-numerics:  # what portable numerics cost (docs/configuration.md)
	$(BIN)/python -m benchmarks.speed.portable_numerics

bench-fidelity:
	for dataset in breastmnist retinamnist; do \
		$(BIN)/fedsieve compare --params benchmarks/params/fidelity-$$dataset.yaml && \
		cp reports/compare/summary.md benchmarks/results/fidelity-$$dataset.md && \
		cp reports/compare/summary.json benchmarks/results/fidelity-$$dataset.json || exit 1; \
	done

bench-resnet18:
	$(BIN)/fedsieve run --params benchmarks/params/resnet18-breastmnist.yaml

# The compose stack's secrets (docker-compose.yml refuses to start without them), random,
# written once to .env (mode 600; git and the image's build context ignore it).
compose-env:
	@test ! -e .env || { echo ".env exists: keeping its secrets"; exit 0; }; umask 077 && \
	$(PYTHON) -c 'import secrets; t = secrets.token_urlsafe; print(f"FEDSIEVE_PREFECT_AUTH=fedsieve:{t(24)}\nFEDSIEVE_MLFLOW_PASSWORD={t(24)}\nFEDSIEVE_MLFLOW_SECRET_KEY={t(32)}")' > .env && \
	echo ".env written: the Prefect and MLflow servers' credentials"

container-smoke:  # needs a running Docker engine; minutes (docs/container.md)
	bash scripts/container_smoke.sh

container-faults:  # needs a running Docker engine; eight faults on the compose stack, the table in docs/operations.md from its record
	$(BIN)/python -m scripts.container_faults --results benchmarks/results/container-faults.json

federation-smoke:  # needs a running Docker engine; the SuperLink and three sites as containers (docs/federation.md)
	$(BIN)/python -m scripts.federation_smoke

clean:
	rm -rf artifacts reports .prefect mlflow.db mlartifacts mlruns
