"""Which modules a vLLM import needs that this machine lacks, all in one run: imports
``MODULE`` (argument; default ``vllm.entrypoints.llm``) in a fresh process again and
again, each time standing in an empty module for the one the last attempt found missing,
until the import goes through, fails otherwise, or ``SECONDS`` (second argument, default
90) pass. Prints one JSON line: the missing top-level modules in the order found, and how
the last attempt ended. The stand-ins exist only to see past a missing module to the
next: nothing is run with them (``tests/python/scenarios/vllm_cumem.py`` runs vLLM's
allocator for real)."""

import json
import subprocess
import sys
import time

module = sys.argv[1] if len(sys.argv) > 1 else "vllm.entrypoints.llm"
budget = float(sys.argv[2]) if len(sys.argv) > 2 else 90.0

PROBE = r"""
import importlib, importlib.abc, importlib.machinery, json, sys
from unittest import mock
stand_in = set(json.loads(sys.argv[2]))
class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if any(name == s or name.startswith(s + ".") for s in stand_in):
            return importlib.machinery.ModuleSpec(name, Loader(), is_package=True)
        return None
class Loader(importlib.abc.Loader):
    def create_module(self, spec):
        m = mock.MagicMock(name=spec.name)
        m.__path__, m.__spec__, m.__name__ = [], spec, spec.name
        return m
    def exec_module(self, module):
        pass
sys.meta_path.insert(0, Finder())
try:
    importlib.import_module(sys.argv[1])
    print(json.dumps({"ok": True}))
except ModuleNotFoundError as e:
    print(json.dumps({"missing": e.name}))
except BaseException as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"[:600]}))
"""

missing: list = []
start = time.monotonic()
last: dict = {}
while time.monotonic() - start < budget:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module, json.dumps(missing)],
        capture_output=True,
        text=True,
        timeout=max(10.0, budget),
    )
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    last = json.loads(lines[-1]) if lines else {"error": done.stderr[-600:]}
    name = last.get("missing")
    if not name:
        break
    # A distribution by its top-level module; a module of vLLM's own by its full name (an
    # extension left out of what was carried).
    top = name if name.split(".")[0] == "vllm" else name.split(".")[0]
    if top in missing:
        last = {"error": f"{name} still missing with {top} stood in"}
        break
    missing.append(top)
print(json.dumps({"module": module, "missing": missing, "last": last, "seconds": round(time.monotonic() - start, 1)}))
