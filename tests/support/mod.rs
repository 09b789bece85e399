//! What the binary's integration tests (`cli`, `ranks`, `mapped_inputs`) share: the
//! repository root, running the binary from it, a transcript of a run for snapshots, and
//! where snapshots are kept.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Runs the binary from the repository root, so paths in its output are stable.
pub fn graphcheck(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_graphcheck"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("graphcheck runs")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8(b.to_vec()).expect("utf-8 output")
}

/// stdout, stderr and exit code as one snapshot.
pub fn transcript(args: &[&str], out: &Output) -> String {
    format!(
        "$ graphcheck {}\nexit: {}\n--- stdout\n{}--- stderr\n{}",
        args.join(" "),
        out.status.code().map_or("signal".into(), |c| c.to_string()),
        text(&out.stdout),
        text(&out.stderr)
    )
}

/// Snapshots in the top-level `snapshots/`, named `<snapshot>@<name>` and recording the
/// fixture they were made from (`input`).
pub fn settings(name: &str, input: &Path) -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path(root().join("snapshots"));
    s.set_prepend_module_to_snapshot(false);
    s.set_input_file(input);
    s.set_snapshot_suffix(name.to_string());
    s
}
