#!/usr/bin/env bash
# Installs the tools the tests need, where missing: cargo-insta, pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

INSTA_VERSION=1.49.0
if ! cargo insta --version 2>/dev/null | grep -q "$INSTA_VERSION"; then
    echo "installing cargo-insta $INSTA_VERSION (about a minute)" >&2
    cargo install cargo-insta --version "$INSTA_VERSION" --locked --quiet
fi
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -r ci/requirements-test.txt
