# kktlab: `make run` (quickstart) and `make test` (the whole suite). See README.md.
PY      ?= python3.11
VENV    ?= .venv
BIN     := $(VENV)/bin
TORCH   ?= torch==2.13.0
CONFIG  ?= configs/quickstart.yaml configs/quickstart-forging.yaml configs/quickstart-unlearning.yaml configs/quickstart-lazy.yaml configs/quickstart-reconstruct.yaml configs/pipeline-small.yaml
export DO_NOT_TRACK := 1
# bytecode cached (__pycache__/, git-ignored): with PYTHONDONTWRITEBYTECODE set, as on the CI image, every
# process recompiled the project and pytest re-rewrote the tests' asserts (collection 27 s -> 11 s wall)
unexport PYTHONDONTWRITEBYTECODE
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export OMP_WAIT_POLICY := PASSIVE
# MKL's dgemm bit-identical whatever the operands' alignment (deploy/runtime.py QUIET_ENV, issue 29)
export MKL_CBWR ?= AVX2,STRICT
export DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED := False
export PREFECT_HOME ?= $(CURDIR)/.prefect
PPORT   ?= 4200
POOL    ?= kktlab-pool
# seconds between flow-run heartbeats (make worker); make deploy crashes runs silent for 3x this
HEARTBEAT ?= 30
DPORT   ?= 8786
DHOST   ?= 127.0.0.1
GPU     ?=
N       ?= 1
# one way to name the Prefect server, honoured by every target and kktlab command: an exported
# PREFECT_API_URL wins; else the local server on PPORT (kktlab commands also read the Prefect profile)
PREFECT_API_URL ?= http://127.0.0.1:$(PPORT)/api
# a worker asks the server for queued runs every 2 s (Prefect's default: 10 s)
export PREFECT_WORKER_QUERY_SECONDS ?= 2

.PHONY: venv install run test test-fast test-paper test-durations bench server worker deploy dask-scheduler dask-worker clean

$(BIN)/kktlab: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)" -e ".[dev]"
	touch $(BIN)/kktlab

venv install: $(BIN)/kktlab

run: install
	$(BIN)/kktlab run $(CONFIG)

# the whole suite on 3 processes on 2 cores (pytest-xdist; a file's tests run in one, so its module
# fixtures are made once): the served and kill drills wait on servers and heartbeats for minutes, a third
# process computes meanwhile; files go out slowest first (tests/conftest.py orders them by the recorded
# durations; --no-loadscope-reorder stops xdist from re-sorting them by test count, which had sent the
# 1-test, 150 s crash drill last); the paper-size checks are `make test-paper` (tests/README.md)
XDIST   ?= -n 3 --dist loadfile --no-loadscope-reorder
test: install
	$(BIN)/python -m pytest -q -ra --durations=15 $(XDIST) -m "not paper" $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -q -ra $(XDIST) -m "not slow and not requires_services and not paper" $(PYTEST_ARGS)

# paper-size variants of predictions make test checks at CI size (minutes to hours; a GPU machine helps)
test-paper: install
	$(BIN)/python -m pytest -q -ra --durations=15 -m paper $(PYTEST_ARGS)

# every test's wall and CPU time (tests/cpu_clock.py), written to benchmarks/results/test_durations.json (and its top 30 printed)
test-durations: install
	rm -rf .test-cpu; s=$$(date +%s); KKTLAB_TEST_CPU=.test-cpu $(BIN)/python -m pytest -q $(XDIST) -m "not paper" \
	  --junitxml=.test-durations.xml $(PYTEST_ARGS); \
	$(BIN)/python benchmarks/test_durations.py .test-durations.xml --cpu .test-cpu --wall $$(( $$(date +%s) - s ))

bench: install
	$(BIN)/python benchmarks/run_all.py

# the docs site (mkdocs-material, mkdocs.yml) into site/; --strict: a broken link or anchor, or a reference
# page docs/gen_reference.py cannot generate from the code, fails the build
.PHONY: docs tutorial
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# docs/tutorial.md from a fresh run of configs/pipeline-small.yaml (~35 s on 2 cores): every number on the
# page is written by this run (docs/gen_tutorial.py executes the page's code blocks against the store)
tutorial: install
	rm -rf results/pipeline-small.zarr results/pipeline-small.zarr.*
	$(BIN)/kktlab run configs/pipeline-small.yaml
	$(BIN)/python docs/gen_tutorial.py

# a line every 10 s until the server answers (about a minute the first time), then one that it does
server: install
	$(BIN)/python -m deploy.launch wait http://127.0.0.1:$(PPORT)/api/health & \
	PREFECT_UI_API_URL=http://127.0.0.1:$(PPORT)/api $(BIN)/prefect server start --host 127.0.0.1 --port $(PPORT)

worker: install
	PREFECT_API_URL=$(PREFECT_API_URL) PREFECT_FLOWS_HEARTBEAT_FREQUENCY=$(HEARTBEAT) $(BIN)/prefect worker start --pool $(POOL) --type process

deploy: install
	PREFECT_API_URL=$(PREFECT_API_URL) PREFECT_FLOWS_HEARTBEAT_FREQUENCY=$(HEARTBEAT) $(BIN)/kktlab deploy --pool $(POOL)

dask-scheduler: install
	$(BIN)/python -m deploy.launch scheduler --host $(DHOST) --port $(DPORT)

# N worker processes: make dask-worker N=4; one per GPU: CUDA_VISIBLE_DEVICES=i make dask-worker GPU=1
dask-worker: install
	$(BIN)/python -m deploy.launch worker tcp://$(DHOST):$(DPORT) --host $(DHOST) -n $(N) $(if $(GPU),--gpu)

clean:
	rm -rf results .prefect .pytest_cache
