//! Integration tests of the `graphcheck` binary's way with the user's files: `--output`
//! never harms what its path names (regular files replaced atomically, links followed,
//! devices, FIFOs and standard output written in place, directories and inputs refused),
//! `-` reads a document from standard input, and `explain` refuses malformed targets.

#![cfg(unix)]

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A scenario with findings (exit 1), so a written report is never empty.
const MANIFEST: &str = "fixtures/synthetic/marlin_workspace_rebuilt/manifest.json";
const LIVE: &str = "fixtures/synthetic/marlin_workspace_rebuilt/live.json";
const ALLOW: &str = "fixtures/synthetic/allowlisted_workspace/allow.toml";

fn graphcheck() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_graphcheck"));
    c.current_dir(root());
    c
}

fn run(args: &[&str]) -> Output {
    graphcheck().args(args).output().expect("graphcheck runs")
}

/// Runs with `input` on standard input.
fn run_with_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = graphcheck()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("graphcheck runs");
    // A graphcheck that stops reading early (an error) closes the pipe: not the test's
    // failure, which the caller's assertions name.
    let _ = child.stdin.take().unwrap().write_all(input);
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The JSON report of the scenario, as stdout carries it.
fn report() -> Vec<u8> {
    let out = run(&["verify", MANIFEST, LIVE, "--format", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    out.stdout
}

fn verify_to(output: &Path) -> Output {
    run(&[
        "verify",
        MANIFEST,
        LIVE,
        "--format",
        "json",
        "--output",
        output.to_str().unwrap(),
    ])
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// Regression: a symlink to a regular file lost the link and left its target unwritten;
/// now the target is replaced (keeping its mode) and the link stays.
#[test]
fn a_symlink_to_a_file_writes_the_target_and_keeps_link_and_mode() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("report.json");
    std::fs::write(&target, b"old").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o640)).unwrap();
    let link = dir.path().join("link.json");
    symlink(&target, &link).unwrap();
    let out = verify_to(&link);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    assert_eq!(std::fs::read(&target).unwrap(), report());
    assert_eq!(mode(&target), 0o640);
    // No temporary file is left beside the target.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}

/// Regression: a symlink to a directory was replaced by a file (exit 1); now it is an
/// error (exit 2), as a real directory is, and both are left as they were.
#[test]
fn a_directory_or_a_link_to_one_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("reports");
    std::fs::create_dir(&real).unwrap();
    let link = dir.path().join("reports-link");
    symlink(&real, &link).unwrap();
    for p in [&real, &link] {
        let out = verify_to(p);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {err}", p.display());
        assert!(err.contains("is a directory"), "{err}");
        assert!(out.stdout.is_empty());
    }
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    assert!(real.is_dir());
    assert_eq!(std::fs::read_dir(&real).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}

/// Regression: a missing folder was named by the temporary file that could not be made in
/// it (`No such file or directory … at path "/nonexist/d/.graphcheck-5k8Xk2.tmp"`).
#[test]
fn an_output_in_a_missing_folder_names_the_folder() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no/such");
    let out = verify_to(&missing.join("x.txt"));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.ends_with(&format!(
            "caused by: the folder {} does not exist\n",
            missing.display()
        )),
        "{err}"
    );
    assert!(!err.contains(".graphcheck-"), "{err}");
}

/// Regression: a FIFO was replaced by a regular file; now the report goes through it to
/// its reader, and it stays a FIFO.
#[test]
fn a_fifo_is_written_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    let child = graphcheck()
        .args(["verify", MANIFEST, LIVE, "--format", "json", "--output"])
        .arg(&fifo)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader's open returns once graphcheck opens the FIFO to write, and its read ends
    // when graphcheck closes it.
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = fifo.clone();
    std::thread::spawn(move || tx.send(std::fs::read(reader)));
    let out = child.wait_with_output().unwrap();
    assert!(
        std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo(),
        "the FIFO was replaced: {}",
        text(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let got = match rx.recv_timeout(std::time::Duration::from_secs(10)) {
        Ok(r) => r.unwrap(),
        Err(_) => {
            // graphcheck never opened it: open and close it here, so the reader gets an
            // empty read instead of waiting for ever.
            drop(std::fs::OpenOptions::new().write(true).open(&fifo));
            rx.recv().unwrap().unwrap()
        }
    };
    assert_eq!(got, report());
}

/// Whether this process may make device nodes (root, in effect): then a regression that
/// renames over a path would replace the machine's own `/dev/null` and `/dev/stdout`, so
/// the tests use private stand-ins made in `dir` instead. Without the privilege, renaming
/// into `/dev` fails and the real ones are safe to use.
fn private_null(dir: &Path) -> Option<PathBuf> {
    let p = dir.join("null");
    let made = Command::new("mknod")
        .arg(&p)
        .args(["c", "1", "3"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    made.then_some(p)
}

/// Regression: `/dev/null` (or a link to it) was renamed over: as root it became a regular
/// file; otherwise the write failed (exit 2). It is written in place and stays a device.
#[test]
fn dev_null_is_written_in_place_and_stays_a_device() {
    let dir = tempfile::tempdir().unwrap();
    let null = private_null(dir.path()).unwrap_or_else(|| PathBuf::from("/dev/null"));
    if std::fs::OpenOptions::new().write(true).open(&null).is_err() {
        eprintln!("skipped: {} is not writable here", null.display());
        return;
    }
    let link = dir.path().join("null-link");
    symlink(&null, &link).unwrap();
    for p in [&null, &link] {
        let out = verify_to(p);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}: {}",
            p.display(),
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty());
    }
    let dev = std::fs::symlink_metadata(&null).unwrap().file_type();
    assert!(
        dev.is_char_device(),
        "{} is no longer a device",
        null.display()
    );
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
}

/// Regression: a link to `/proc/self/fd/1` was replaced by a 0600 file and nothing was
/// printed; `/dev/stdout` and `/proc/self/fd/1` reach the command's standard output, a pipe
/// or a file, and the link stays.
#[cfg(target_os = "linux")]
#[test]
fn standard_output_paths_reach_standard_output() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("stdout");
    symlink("/proc/self/fd/1", &link).unwrap();
    let want = report();
    // `/dev/stdout` itself only where a regression could not replace it (see private_null).
    let mut paths = vec![Path::new("/proc/self/fd/1"), link.as_path()];
    if private_null(dir.path()).is_none() {
        paths.push(Path::new("/dev/stdout"));
    }
    for p in paths {
        let out = verify_to(p);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}: {}",
            p.display(),
            text(&out.stderr)
        );
        assert_eq!(out.stdout, want, "{}", p.display());
    }
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());

    // Standard output redirected to a file (a shell's `> file`).
    let file = dir.path().join("redirected.json");
    let status = graphcheck()
        .args(["verify", MANIFEST, LIVE, "--format", "json", "--output"])
        .arg(&link)
        .stdout(std::fs::File::create(&file).unwrap())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(1));
    assert_eq!(std::fs::read(&file).unwrap(), want);
}

/// Regression: a socket was replaced by a regular file; it cannot be written by path, so
/// that is an error (exit 2), and it stays a socket.
#[test]
fn a_socket_is_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let out = verify_to(&sock);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        std::fs::symlink_metadata(&sock)
            .unwrap()
            .file_type()
            .is_socket()
    );
}

/// Regression: `--output` naming the input manifest silently overwrote it. An output that
/// is the manifest, the live snapshot or the allowlist (by name, through a link, or as the
/// file behind `-`) is refused with exit 2 before anything is written.
#[test]
fn an_output_that_is_an_input_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let copy = |name: &str, from: &str| {
        let p = dir.path().join(name);
        std::fs::copy(root().join(from), &p).unwrap();
        p
    };
    let (m, l, a) = (
        copy("m.json", MANIFEST),
        copy("l.json", LIVE),
        copy("allow.toml", ALLOW),
    );
    let link = dir.path().join("m-link.json");
    symlink(&m, &link).unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let base = vec!["verify".to_string(), s(&m), s(&l), "--allow".into(), s(&a)];
    for (output, role) in [
        (&m, "manifest"),
        (&l, "live snapshot"),
        (&a, "allowlist"),
        (&link, "manifest"),
    ] {
        let mut args = base.clone();
        args.extend(["--output".to_string(), s(output)]);
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(&argv);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(&format!("is the {role} "))
                && err.contains("refusing to overwrite an input"),
            "{err}"
        );
    }
    // The manifest read from standard input is the file behind it.
    let child = graphcheck()
        .args(["verify", "-", "--output"])
        .arg(&m)
        .stdin(std::fs::File::open(&m).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("manifest read from standard input"), "{err}");
    // Nothing was written.
    assert_eq!(
        std::fs::read(&m).unwrap(),
        std::fs::read(root().join(MANIFEST)).unwrap()
    );
    assert_eq!(
        std::fs::read(&l).unwrap(),
        std::fs::read(root().join(LIVE)).unwrap()
    );
    assert_eq!(
        std::fs::read(&a).unwrap(),
        std::fs::read(root().join(ALLOW)).unwrap()
    );
}

/// Regression: `-` was taken as a file name. It reads the document from standard input,
/// in every command that takes one, with the same result as the file.
#[test]
fn a_dash_reads_a_document_from_standard_input() {
    let m = std::fs::read(root().join(MANIFEST)).unwrap();
    let l = std::fs::read(root().join(LIVE)).unwrap();
    let cases: [(&[&str], &[&str], &[u8]); 6] = [
        (&["show", "-"], &["show", MANIFEST], &m),
        (
            &["show", "-", "--normalized"],
            &["show", LIVE, "--normalized"],
            &l,
        ),
        (
            &["verify", "-", LIVE, "--format", "json"],
            &["verify", MANIFEST, LIVE, "--format", "json"],
            &m,
        ),
        (
            &["verify", MANIFEST, "-", "--format", "json"],
            &["verify", MANIFEST, LIVE, "--format", "json"],
            &l,
        ),
        (
            &["explain", "-", "--kernel", "marlin"],
            &["explain", MANIFEST, "--kernel", "marlin"],
            &m,
        ),
        (
            &["diff", MANIFEST, "-", "--format", "json"],
            &["diff", MANIFEST, LIVE, "--format", "json"],
            &l,
        ),
    ];
    for (with_dash, with_file, input) in cases {
        let got = run_with_stdin(with_dash, input);
        let want = run(with_file);
        assert_eq!(
            got.status.code(),
            want.status.code(),
            "{with_dash:?}: {}",
            text(&got.stderr)
        );
        assert_eq!(text(&got.stdout), text(&want.stdout), "{with_dash:?}");
    }
    // Errors name it.
    let out = run_with_stdin(&["show", "-"], b"{\"format_version\": 1");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).starts_with("error: <stdin>:"),
        "{}",
        text(&out.stderr)
    );
    // The table of a diff names it too.
    let out = run_with_stdin(&["diff", MANIFEST, "-"], &l);
    assert!(
        text(&out.stdout).contains("<stdin>"),
        "{}",
        text(&out.stdout)
    );
}

/// Regression: standard input can be read once, so two `-` are a usage error (exit 2),
/// reported before anything is read.
#[test]
fn two_dashes_are_a_usage_error() {
    for args in [&["verify", "-", "-"][..], &["diff", "-", "-"]] {
        // Nothing is written to its standard input: it must not wait for it.
        let out = graphcheck()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("can be read only once"), "{err}");
    }
}

/// Regression: `--allow -` failed with "failed to read allowlist - … No such file", and
/// `convert - --output /dev/stdin` named the output as "the document /dev/stdin" where
/// verify says "standard input".
#[test]
fn standard_input_is_named_so_and_is_no_allowlist() {
    let out = graphcheck()
        .args(["verify", MANIFEST, "--allow", "-"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("standard input (`-`) is for documents only"),
        "{err}"
    );
    let document = std::fs::File::open(root().join(MANIFEST)).unwrap();
    let out = graphcheck()
        .args(["convert", "-", "--output", "/dev/stdin"])
        .stdin(document)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the document read from standard input"),
        "{err}"
    );
}

/// Regression: a malformed address or owner path was taken as an owner path ("no such
/// owner path", exit 1), an empty target listed unrelated paths, and `--kernel ''` matched
/// every node.
/// Each is now a usage error (exit 2) that says what is wrong.
#[test]
fn malformed_explain_targets_are_usage_errors() {
    let long = format!("0x{}", "7".repeat(20));
    for (target, says) in [
        ("0x", "no hexadecimal digits"),
        ("0xZZ", "'Z' is not a hexadecimal digit"),
        (long.as_str(), "20 hexadecimal digits"),
        ("0X7f2c2520b400", "lowercase `0x`"),
        ("", "the target is empty"),
        (
            "model..x",
            "`model..x` is not an owner path: expected an attribute name after '.' (at byte 6)",
        ),
        (
            "model.layers[0",
            "`model.layers[0` is not an owner path: unterminated index: expected ']'",
        ),
    ] {
        let out = run(&["explain", MANIFEST, target]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{target:?}: {err}");
        assert!(err.contains(says), "{target:?}: {err}");
        assert!(!text(&out.stdout).contains("owner path"), "{target:?}");
    }
    let out = run(&["explain", MANIFEST, "--kernel", ""]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("would match every node"), "{err}");
    // A well-formed address still explains (exit 0 or 1, never 2).
    let out = run(&["explain", MANIFEST, "0x7f2c00000000"]);
    assert_ne!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

/// Runs `graphcheck args` as a user other than root: itself where this test is not root,
/// else `nobody` through `setpriv` (root may write any file, so the refusals below would
/// never arise). `None` where neither can be had.
fn as_unprivileged(args: &[&str]) -> Option<Output> {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self").ok()?.uid();
    if uid != 0 {
        return Some(run(args));
    }
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_graphcheck"))
        .args(args)
        .current_dir(root())
        .output()
        .ok()?;
    // setpriv itself failing (no such user switch allowed here) says so on stderr.
    (!text(&out.stderr).starts_with("setpriv:")).then_some(out)
}

/// Regression (issue 25, item 7): as `nobody`, in a folder anyone may write, `--output`
/// replaced a root-owned read-only file (renaming over a file needs only the folder's
/// permission; the shell's `>` refuses). Now refused, exit 2, naming it, the file kept.
#[test]
fn a_file_this_user_may_not_write_is_refused_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let target = dir.path().join("report.txt");
    std::fs::write(&target, b"keep me").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o444)).unwrap();
    let t = target.to_str().unwrap();
    let Some(out) = as_unprivileged(&["verify", MANIFEST, LIVE, "--output", t]) else {
        eprintln!("skipped: running as root and `setpriv` cannot switch to nobody here");
        return;
    };
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{t} is not writable by this user: refusing to replace it"
        )),
        "{err}"
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
    assert_eq!(mode(&target), 0o444);
    // A new file in a folder this user may not write: the error names the output, not the
    // temporary file that could not be made.
    let closed = tempfile::tempdir().unwrap();
    std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o555)).unwrap();
    let new = closed.path().join("new.txt");
    let out = as_unprivileged(&["verify", MANIFEST, LIVE, "--output", new.to_str().unwrap()])
        .expect("as above");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "cannot write {}: no file can be made in {} to replace it atomically: permission denied",
            new.display(),
            closed.path().display()
        )),
        "{err}"
    );
    assert!(!err.contains(".graphcheck-"), "{err}");
    std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Regression (issue 25, item 7): `--output -` wrote a file named `-`; it is standard
/// output, for `verify` and `convert` alike.
#[test]
fn output_dash_is_standard_output() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["verify", MANIFEST, LIVE, "--output", "-"][..],
        &[
            "convert",
            MANIFEST,
            "--format-version",
            "1",
            "--output",
            "-",
        ][..],
    ] {
        // Run from an empty folder, paths made absolute, so that a file named `-` shows.
        let abs: Vec<String> = args
            .iter()
            .map(|a| {
                if a.starts_with("fixtures/") {
                    root().join(a).to_str().unwrap().to_string()
                } else {
                    a.to_string()
                }
            })
            .collect();
        let out = Command::new(env!("CARGO_BIN_EXE_graphcheck"))
            .args(&abs)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(!out.stdout.is_empty(), "{args:?}: nothing on stdout");
        assert!(
            !dir.path().join("-").exists(),
            "{args:?} wrote a file named -"
        );
    }
}
