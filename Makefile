# The commands used every day, each spelled as CI spells it (.ci/run, ci/test.sh): where a
# ci/ script holds the logic, the target calls the script. `make help` lists the targets.
# The README's two set-up commands stay the way in; this file only names what follows.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# The project's Python environment, found as ci/venv.sh finds it (GRAPHCHECK_VENV, else the
# cache folder). PY= picks another interpreter for the Python targets alone.
VENV ?= $(or $(GRAPHCHECK_VENV),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/graphcheck/ci-venv)
PY ?= $(VENV)/bin/python
# The Rust tests that compile the GPU digest kernel find NVRTC through it (ci/venv.sh).
export GRAPHCHECK_VENV := $(VENV)

# T: a test filter for test-rust (a test name, or part of one) or test-python (a pytest
# node id or -k expression); S: a scenario of fixtures/synthetic/; FUZZ: a fuzz target.
T ?=
S ?= marlin_workspace_rebuilt
FUZZ ?= all
FUZZ_SECONDS ?= 10
FUZZ_SEED ?= 1
BENCH_ARGS ?=

.PHONY: help ci tools build test test-rust test-python typecheck lint fmt snapshots \
	scenario fixtures fixtures-check fuzz bench wheel docs docs-update

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | \
	  awk -F':.*## ' '{ printf "  make %-15s %s\n", $$1, $$2 }'
	@echo "  variables: T=test filter, S=scenario ($(S)), FUZZ=target ($(FUZZ)),"
	@echo "             FUZZ_SECONDS=$(FUZZ_SECONDS) per target, PY=$(PY)"

ci: ## everything CI runs: formatting, clippy, every test (.ci/run)
	.ci/run

tools: ## install what the tests need where missing: cargo-insta, pytest, maturin, mypy, torch
	ci/install-tools.sh

build: ## build the workspace, all targets and features, as ci/test.sh does
	cargo build --workspace --all-targets --all-features --locked

test: ## every test, Rust and Python, as CI runs them (ci/test.sh)
	ci/test.sh

test-rust: tools build ## the Rust tests, snapshots checked (T=NAME: the tests whose name holds NAME)
	CI=true cargo insta test --workspace --all-features --check \
	  $(if $(T),-- $(T),--unreferenced=reject)

test-python: build wheel ## the Python tests against the freshly built wheel (T=tests/python/FILE.py::TEST)
	"$(PY)" -m pytest -q -rs $(or $(T),tests/python)

typecheck: ## mypy over the Python package ([tool.mypy] in pyproject.toml)
	"$(PY)" -m mypy python/graphcheck

lint: ## cargo fmt --check and clippy, as .ci/run runs them
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

fmt: ## format the Rust code (rewrites files)
	cargo fmt --all

snapshots: tools ## run the Rust tests, then review the snapshots that changed (cargo insta review)
	cargo insta test --workspace --all-features --review

scenario: build ## verify one synthetic scenario (S=NAME); fixtures/index.json says what it must report
	@d=fixtures/synthetic/$(S); test -f $$d/manifest.json || \
	  { echo "no scenario $(S): the folders of fixtures/synthetic/ are the names" >&2; exit 2; }; \
	args=($$d/manifest.json); \
	if [ -f $$d/live.json ]; then args+=($$d/live.json); fi; \
	if [ -f $$d/allow.toml ]; then args+=(--allow $$d/allow.toml); fi; \
	echo "target/debug/graphcheck verify $${args[*]}"; \
	rc=0; target/debug/graphcheck verify "$${args[@]}" || rc=$$?; \
	echo "exit code $$rc (1: findings, 2: an error)"; test $$rc -le 1

fixtures: build ## rewrite fixtures/ from the generator (gen/; synthetic/, bad/, ranks/, index.json)
	target/debug/graphcheck-gen fixtures

fixtures-check: build ## compare fixtures/ with the generator; exit 1 listing what differs
	target/debug/graphcheck-gen fixtures --check

fuzz: ## a short fuzz pass (FUZZ=target or all, FUZZ_SECONDS per target, FUZZ_SEED)
	cargo build --release --locked -p graphcheck-cli -p graphcheck-fuzz
	target/release/graphcheck-fuzz $(FUZZ) --seconds $(FUZZ_SECONDS) --seed $(FUZZ_SEED)

bench: ## verify at full size against the Python baseline (benches/README.md; BENCH_ARGS=...)
	"$(PY)" benches/verify_bench.py $(BENCH_ARGS)

docs: tools ## build the docs site into target/site, warnings as errors (as ci/test.sh)
	NO_MKDOCS_2_WARNING=1 "$(PY)" -m mkdocs build --strict --site-dir target/site

docs-update: wheel ## write the real output of every docs console block back into its page
	"$(PY)" ci/docs-update.py

wheel: tools ## the release wheel into target/wheels-dev, installed into the venv (as ci/test.sh)
	rm -rf target/wheels-dev
	"$(PY)" -m maturin build --release --quiet --locked -i "$(PY)" -o target/wheels-dev
	"$(PY)" -m pip install --quiet --disable-pip-version-check \
	  --force-reinstall --no-deps target/wheels-dev/graphcheck-*.whl
