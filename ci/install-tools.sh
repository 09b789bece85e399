#!/usr/bin/env bash
# Installs the tools the tests need, where missing: cargo-insta, and in the project's own
# Python environment (ci/venv.sh: never the machine's global Python) pytest, maturin, torch.
set -euo pipefail
cd "$(dirname "$0")/.."
. ci/venv.sh

INSTA_VERSION=1.49.0
if ! cargo insta --version 2>/dev/null | grep -q "$INSTA_VERSION"; then
    echo "installing cargo-insta $INSTA_VERSION (about a minute)" >&2
    cargo install cargo-insta --version "$INSTA_VERSION" --locked --quiet
fi
# The shells and groff the completion and man-page tests check their output with
# (tests/completions.rs); without them those checks say "not checked" and pass. Installed
# where this machine can (Debian, as root); elsewhere they stay unchecked, as said.
if ! command -v zsh >/dev/null || ! command -v fish >/dev/null || ! command -v groff >/dev/null; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "installing zsh, fish and groff for the completion and man-page checks" >&2
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zsh fish groff-base >/dev/null) \
            || echo "could not install zsh, fish, groff: those checks will say not checked" >&2
    fi
fi
"$PY" -m pip install --quiet --disable-pip-version-check -r ci/requirements-test.txt
# The docs site's generator (mkdocs.yml), built by ci/test.sh with warnings as errors.
"$PY" -m pip install --quiet --disable-pip-version-check -r ci/requirements-docs.txt

# PyTorch for the graphcheck.torch tests, which use CPU tensors only. PyPI has no CPU-only
# build for Linux: its torch wheel (540 MB) does not import without the CUDA libraries it
# depends on (`--no-deps` fails on libcudart.so.13), so the whole set is installed: about
# 3 GB of downloads, 5.3 GB on disk, about 2.5 minutes on a fresh machine. Skipped when
# torch already imports (CI runs on the machine that installed it).
TORCH_VERSION=2.15.0
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "installing torch $TORCH_VERSION with its CUDA libraries (about 3 GB, a few minutes)" >&2
    # No pip cache: the wheels are about 3 GB, and a second copy of them in the cache
    # could fill a small CI disk.
    "$PY" -m pip install --quiet --disable-pip-version-check --no-cache-dir "torch==$TORCH_VERSION"
fi
