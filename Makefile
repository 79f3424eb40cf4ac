# One-command set-up: every target creates .venv and installs what it needs.
# torch is pinned to the CPU wheel that ships on this machine image; any other
# version would download a multi-GB CUDA build.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
TORCH  := torch==2.13.0

# Python keeps the modules it compiles (in __pycache__, which git ignores) even where the
# environment says not to (PYTHONDONTWRITEBYTECODE): the tests start hundreds of Python
# processes that import wdsx, and each would otherwise compile it again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-fast bench lint typecheck fuzz clean install docs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[torch,fast,s3,progress]'
	touch $@

# Azurite (the Azure Storage emulator the tests start) comes from npm, into a project-local folder.
$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[test,bench,docs]'
	npm install --prefix .npm-tools --no-audit --no-fund --silent azurite@3.35.0
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/python examples/demo.py

# The whole suite on two processes: a test file stays in one (its servers are started once
# per file), and tests find free ports, so the two never collide. A worker that dies ends the
# run (a failure) instead of being replaced. The Ray cluster's tests run on their own after,
# capturing Python's output only: the test process, Ray's driver, has ended with status 1 and no
# report (in parallel runs, and once alone, in a Ray Data test), the way a driver ends itself
# when it thinks its node dead. What Ray's own code and the cluster's watchdog then write to
# standard error reaches the terminal.
test: lint typecheck docs
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --max-worker-restart=0 --durations=25 \
		--ignore=tests/test_ray_writer.py tests
	$(BIN)/python -m pytest -q -p no:cacheprovider --capture=sys tests/test_ray_writer.py

# The quick loop: everything but the tests marked slow (torchrun, SIGKILL, subprocesses, large
# data, the documentation's examples), on two processes (a test file stays in one).
test-fast: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow" -n 2 --dist loadfile tests

# The loaders `make bench` sets beside wdsx (benchmarks/bench_peers.py), installed for it only.
# litdata and mosaicml-streaming name torchvision (Mosaic also transformers) as requirements the
# benchmark never uses: they come without their requirements, and the ones they use are named.
PEERS     := litdata==0.2.76 mosaicml-streaming==0.13.0
PEER_DEPS := tifffile obstore lightning-utilities boto3 brotli python-snappy zstd 'xxhash<4' catalogue

# The tutorial benchmark reads Debian's openclipart-png drawings; without them (no apt-get, or
# not root) it uses generated photo-like images instead.
bench: $(VENV)/.installed-test
	-test -d /usr/share/openclipart/png || { apt-get update -qq; apt-get install -y --no-install-recommends openclipart-png; }
	-test -d /usr/share/datasets/fashion-mnist || { apt-get update -qq; apt-get install -y --no-install-recommends dataset-fashion-mnist; }
	echo '$(TORCH)' > $(VENV)/bench-constraints.txt
	-$(BIN)/pip install -q -c $(VENV)/bench-constraints.txt --no-deps $(PEERS)
	-$(BIN)/pip install -q -c $(VENV)/bench-constraints.txt $(PEER_DEPS)
	$(BIN)/python benchmarks/run.py

# A long fuzzing campaign (`make test` runs a short one) over the surfaces that read data: tar,
# JSONL and .npy shards, compressed members, HTTP replies, checkpoints (FUZZ_SURFACES=all, new,
# or a comma-separated list). A watchdog and a memory cap per input, a summary by outcome class,
# exit status 1 on any failure.
FUZZ_INPUTS   ?= 1000000
FUZZ_WORKERS  ?= 2
FUZZ_SEED     ?= 1
FUZZ_SURFACES ?= tar,jsonl,npy,members,http,states
fuzz: $(VENV)/.installed-test
	$(BIN)/python -m tests.fuzz --inputs $(FUZZ_INPUTS) --workers $(FUZZ_WORKERS) --seed $(FUZZ_SEED) \
		--surfaces $(FUZZ_SURFACES)

# The documentation site, into site/ (open site/index.html). --strict: a broken link, anchor or
# API reference fails the build. docs/hooks/ generates the CLI help and the performance page's
# tables and plots (from benchmarks/results/) while it builds.
docs: $(VENV)/.installed-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

lint: $(VENV)/.installed-test
	$(BIN)/ruff check wdsx tests examples scripts benchmarks docs/hooks
	$(BIN)/ruff format --check wdsx tests examples scripts benchmarks docs/hooks

typecheck: $(VENV)/.installed-test
	$(BIN)/mypy

clean:
	rm -rf $(VENV) demo-out bench-out .cache/clients
