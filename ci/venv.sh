# Sourced by the CI scripts: the project's own Python environment, made where missing, so
# that CI never installs into the machine's global Python. It lives outside the checkout
# (CI runs on a clean one) and is reused between runs: torch and its CUDA libraries are
# about 3 GB. GRAPHCHECK_VENV puts it elsewhere. Sets PY to its interpreter.
GRAPHCHECK_VENV="${GRAPHCHECK_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/graphcheck/ci-venv}"
if [ ! -x "$GRAPHCHECK_VENV/bin/python" ]; then
    echo "creating the project's Python environment in $GRAPHCHECK_VENV" >&2
    python3 -m venv "$GRAPHCHECK_VENV"
fi
PY="$GRAPHCHECK_VENV/bin/python"
# Exported for the Rust tests that compile the GPU digest kernel: they find NVRTC in this
# environment (torch's nvidia packages), as graphcheck.torch finds it on its sys.path.
export GRAPHCHECK_VENV
