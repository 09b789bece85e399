"""The Python CLI (`python -m graphcheck`, the wheel's `graphcheck` script) is the Rust
binary's own command line (`graphcheck_cli::main_impl`): over the whole fixture corpus —
verify in every format and with allowlists (with and without --deny-unused-allow), show,
show --normalized, explain, diff, schema, the bad inputs (exit 2), help texts and usage
errors — it writes the same bytes to stdout and stderr and exits with the same code."""

import json
import subprocess
import sys

import pytest

import graphcheck
from conftest import REPO, rust_binary
from graphcheck.cli import main

FIXTURES = REPO / "fixtures"
DATA = REPO / "tests" / "python" / "data"


def commands():
    out = []
    for index in (FIXTURES / "index.json", DATA / "index.json"):
        root = index.parent
        doc = json.loads(index.read_text())
        for s in doc["scenarios"]:
            m = str(root / s["manifest"])
            live = [str(root / s["live"])] if s.get("live") else []
            allow = ["--allow", str(root / s["allow"])] if s.get("allow") else []
            name = s["name"]
            for fmt in ("table", "json", "markdown"):
                out.append((f"{name}:verify:{fmt}", ["verify", m, *live, *allow, "--format", fmt]))
            out.append((f"{name}:verify:normalized", ["verify", m, *live, *allow, "--normalized"]))
            if allow:
                # An unused entry warns (exit 0); this flag makes it fail (exit 1).
                for fmt in ("table", "json"):
                    out.append(
                        (
                            f"{name}:verify:deny_unused_allow:{fmt}",
                            ["verify", m, *live, *allow, "--deny-unused-allow", "--format", fmt],
                        )
                    )
            out.append((f"{name}:show", ["show", m]))
            out.append((f"{name}:show:normalized", ["show", m, "--normalized"]))
            if live:
                out.append((f"{name}:show:live", ["show", *live]))
                out.append((f"{name}:diff", ["diff", m, *live]))
                out.append((f"{name}:diff:markdown", ["diff", m, *live, "--format", "markdown"]))
                out.append((f"{name}:diff:json", ["diff", m, *live, "--format", "json"]))
            for i, target in enumerate(s.get("explain", [])):
                args = target.split(" ", 1) if target.startswith("--kernel ") else [target]
                out.append((f"{name}:explain{i}", ["explain", m, *args]))
                out.append((f"{name}:explain{i}:dot", ["explain", m, *args, "--dot", "--normalized"]))
        for bad in doc.get("bad", []):
            path = str(root / bad["file"])
            if bad["as"] == "allow":
                argv = ["verify", str(FIXTURES / "synthetic/marlin_workspace_rebuilt/manifest.json"), "--allow", path]
            else:
                argv = ["verify", path]
            out.append((f"bad:{bad['file']}", argv))
    out.append(("schema", ["schema"]))
    out.append(("explain:nothing", ["explain", str(FIXTURES / "synthetic/marlin_workspace_rebuilt/manifest.json"), "model.nothing"]))
    out.append(("show:missing", ["show", str(REPO / "no-such-file.json")]))
    marlin = str(FIXTURES / "synthetic/marlin_workspace_rebuilt/manifest.json")
    out.append(("diff:same", ["diff", marlin, marlin]))
    # Help, version and usage errors, which clap prints.
    out.append(("help", ["--help"]))
    out.append(("verify:help", ["verify", "--help"]))
    out.append(("version", ["--version"]))
    out.append(("usage:none", []))
    out.append(("usage:verify", ["verify"]))
    out.append(("usage:explain", ["explain", "m.json"]))
    out.append(("usage:nonsense", ["nonsense"]))
    # An abbreviated flag is a usage error in both (argparse used to accept `--form`).
    out.append(("usage:abbreviated", ["verify", marlin, "--form", "json"]))
    return out


@pytest.fixture
def run_python(capfd):
    """Runs the console script's `main` in this process; the command writes to file
    descriptors 1 and 2, which `capfd` captures byte for byte."""

    def run(argv):
        capfd.readouterr()
        code = main(argv)
        out, err = capfd.readouterr()
        return code, out, err

    return run


@pytest.mark.parametrize("argv", [c[1] for c in commands()], ids=[c[0] for c in commands()])
def test_same_bytes_and_exit_code_as_the_rust_binary(argv, run_python):
    rust = subprocess.run([str(rust_binary()), *argv], capture_output=True, text=True)
    code, out, err = run_python(argv)
    assert code == rust.returncode, (err, rust.stderr)
    assert out == rust.stdout
    assert err == rust.stderr


def test_output_file_is_written_atomically(tmp_path, run_python):
    m = str(FIXTURES / "synthetic/marlin_workspace_rebuilt/manifest.json")
    target = tmp_path / "report.json"
    code, out, _ = run_python(["verify", m, "--format", "json", "--output", str(target)])
    assert (code, out) == (1, "")
    rust = subprocess.run([str(rust_binary()), "verify", m, "--format", "json"], capture_output=True, text=True)
    assert target.read_text() == rust.stdout


def test_deny_unused_allow_turns_the_warning_into_a_failure(run_python):
    s = FIXTURES / "synthetic/allowlisted_workspace"
    argv = ["verify", str(s / "manifest.json"), "--allow", str(s / "allow.toml"), "--format", "json"]
    code, out, _ = run_python(argv)
    assert code == 0 and json.loads(out)["findings"][0]["severity"] == "warning"
    code, out, _ = run_python([*argv, "--deny-unused-allow"])
    assert code == 1 and json.loads(out)["findings"][0]["severity"] == "error"


def test_usage_errors_exit_2(run_python):
    assert run_python(["verify"])[0] == 2
    assert run_python(["explain", "m.json"])[0] == 2
    assert run_python(["nonsense"])[0] == 2
    code, _, err = run_python(["verify", "m.json", "--form", "json"])
    assert code == 2 and "unexpected argument '--form'" in err


def test_python_dash_m_and_exit_codes():
    m = str(FIXTURES / "synthetic/marlin_workspace_rebuilt/manifest.json")
    done = subprocess.run([sys.executable, "-m", "graphcheck", "verify", m], capture_output=True, text=True)
    assert done.returncode == 1 and "unregistered" in done.stdout
    clean = FIXTURES / "synthetic/clean_reload_inplace"
    done = subprocess.run(
        [sys.executable, "-m", "graphcheck", "verify", str(clean / "manifest.json"), str(clean / "live.json")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run([sys.executable, "-m", "graphcheck", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("graphcheck ")


def test_standard_input_and_an_output_that_is_an_input(tmp_path):
    """Regression: `-` reads a document from standard input, and an `--output` that is an
    input is refused (exit 2, nothing written), in the console script as in the binary."""
    m = FIXTURES / "synthetic/marlin_workspace_rebuilt/manifest.json"
    data = m.read_bytes()
    copy = tmp_path / "m.json"
    copy.write_bytes(data)
    by_file = subprocess.run([str(rust_binary()), "show", str(m)], capture_output=True)
    for face in ([str(rust_binary())], [sys.executable, "-m", "graphcheck"]):
        done = subprocess.run([*face, "show", "-"], input=data, capture_output=True)
        assert (done.returncode, done.stdout) == (0, by_file.stdout), done.stderr
        done = subprocess.run([*face, "verify", str(copy), "--output", str(copy)], capture_output=True)
        assert done.returncode == 2 and b"refusing to overwrite an input" in done.stderr, done.stderr
        assert copy.read_bytes() == data


def test_explain_refuses_malformed_targets():
    """Regression: `graphcheck.explain` searched a malformed address as an owner path, and an
    empty kernel pattern matched every node; both are errors that say what is wrong."""
    m = FIXTURES / "synthetic/marlin_workspace_rebuilt/manifest.json"
    for target, says in [("0xZZ", "not a hexadecimal digit"), ("0x", "no hexadecimal digits"), ("", "target is empty")]:
        with pytest.raises(graphcheck.GraphcheckError, match=says):
            graphcheck.explain(m, target)
    with pytest.raises(graphcheck.GraphcheckError, match="every node"):
        graphcheck.explain(m, kernel="")
