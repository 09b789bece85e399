#!/usr/bin/env bash
# Runs every test of graphcheck, Rust and Python, installing what they need first.
# Snapshots are checked, never written: a missing, changed or unreferenced snapshot fails.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*" >&2; }

step "installing test tools"
ci/install-tools.sh
. ci/venv.sh

step "building (workspace, all targets)"
cargo build --workspace --all-targets --all-features --locked

step "Rust tests (insta: --check --unreferenced=reject)"
CI=true cargo insta test --workspace --all-features --check --unreferenced=reject

step "Python package (maturin release wheel of python/, as pip install . builds it, installed for the Python tests)"
rm -rf target/wheels-ci
"$PY" -m maturin build --release --quiet --locked -i "$PY" -o target/wheels-ci
"$PY" -m pip install --quiet --disable-pip-version-check \
    --force-reinstall --no-deps target/wheels-ci/graphcheck-*.whl

step "Python type check (mypy over python/graphcheck, [tool.mypy] in pyproject.toml)"
"$PY" -m mypy python/graphcheck

step "docs site (mkdocs build --strict: a broken link, a page outside the nav, an API object not found fail)"
# Not --quiet: mkdocs 1.6 then counts no warning, and --strict passes a broken link
# (tests/python/test_docs.py plants one).
NO_MKDOCS_2_WARNING=1 "$PY" -m mkdocs build --strict --site-dir target/site

step "Python tests"
"$PY" -m pytest -q -rs tests/python
