//! Integration tests of the binary's mapped inputs: a document file of 1 MiB or more named
//! on the command line (not a folder's, not the pair form's) is mapped into memory rather
//! than read (`mapped::mapped_source`; that the binary maps and the console entry point reads
//! is a unit test of `cli/src/lib.rs`), and everything the user sees is as for a file
//! read: the report, the exit code, and the error that names the file and the JSON path of
//! a bad value. Small files, folders, missing paths and FIFOs are left to the loader's read,
//! whose errors they keep.

#![cfg(unix)]

#[allow(dead_code)] // the snapshot helpers are `cli`'s and `ranks`'
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use graphcheck::codec::load::Source;
use graphcheck_cli::mapped::{MAP_FROM, mapped_source};
use support::root;

const SCENARIO: &str = "fixtures/synthetic/freed_then_reused";

/// The binary run from the repository root ([`support::graphcheck`]) with path arguments.
fn run(args: &[&Path]) -> Output {
    let args: Vec<&str> = args
        .iter()
        .map(|a| a.to_str().expect("a UTF-8 path"))
        .collect();
    support::graphcheck(&args)
}

/// `text` with whitespace appended past [`MAP_FROM`]: the same document, large enough to
/// be mapped.
fn padded(dir: &Path, name: &str, text: &[u8]) -> PathBuf {
    let mut bytes = text.to_vec();
    bytes.resize(MAP_FROM as usize + 4096, b' ');
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn a_mapped_pair_verifies_as_a_read_one() {
    let dir = tempfile::tempdir().unwrap();
    let (m, l) = (
        root().join(SCENARIO).join("manifest.json"),
        root().join(SCENARIO).join("live.json"),
    );
    let big_m = padded(dir.path(), "manifest.json", &std::fs::read(&m).unwrap());
    let big_l = padded(dir.path(), "live.json", &std::fs::read(&l).unwrap());
    assert!(matches!(mapped_source(&big_m), Source::Shared { .. }));
    assert!(
        matches!(mapped_source(&m), Source::Path(_)),
        "a small file is read"
    );

    let verify = Path::new("verify");
    let json = [Path::new("--format"), Path::new("json")];
    let read = run(&[verify, &m, &l, json[0], json[1]]);
    let mapped = run(&[verify, &big_m, &big_l, json[0], json[1]]);
    assert_eq!(
        read.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    assert_eq!(mapped.status.code(), read.status.code());
    assert_eq!(mapped.stdout, read.stdout);
    assert!(!read.stdout.is_empty());
}

#[test]
fn a_bad_mapped_document_is_reported_as_a_read_one() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read(root().join(SCENARIO).join("manifest.json")).unwrap();
    let text = String::from_utf8(text).unwrap();
    // A value of the wrong type, so the error has a JSON path to name.
    let bad = text.replacen("\"format_version\": 2", "\"format_version\": \"2\"", 1);
    let bad = if bad == text {
        text.replacen("\"format_version\":2", "\"format_version\":\"2\"", 1)
    } else {
        bad
    };
    assert_ne!(bad, text, "the fixture's format_version was not found");
    let small = dir.path().join("small.json");
    std::fs::write(&small, &bad).unwrap();
    let big = padded(dir.path(), "big.json", bad.as_bytes());
    assert!(matches!(mapped_source(&big), Source::Shared { .. }));

    let verify = Path::new("verify");
    let read = run(&[verify, &small]);
    let mapped = run(&[verify, &big]);
    assert_eq!(
        read.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    assert_eq!(mapped.status.code(), Some(2));
    let (read_err, mapped_err) = (
        String::from_utf8_lossy(&read.stderr),
        String::from_utf8_lossy(&mapped.stderr),
    );
    assert!(read_err.contains("format_version"), "{read_err}");
    assert_eq!(
        mapped_err.replace("big.json", "small.json"),
        read_err,
        "the mapped file's error differs from the read file's"
    );
}

#[test]
fn what_cannot_be_mapped_is_left_to_the_read() {
    let dir = tempfile::tempdir().unwrap();
    // A folder, a missing path, an empty file, a FIFO: each the loader's to read (or to
    // refuse with its own message).
    assert!(matches!(mapped_source(dir.path()), Source::Path(_)));
    let missing = dir.path().join("missing.json");
    assert!(matches!(mapped_source(&missing), Source::Path(_)));
    let empty = dir.path().join("empty.json");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(mapped_source(&empty), Source::Path(_)));
    let fifo = dir.path().join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        assert!(matches!(mapped_source(&fifo), Source::Path(_)));
    }
    let out = run(&[Path::new("verify"), &missing]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("missing.json"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether process `pid` is blocked reading its standard input: `/proc/<pid>/syscall` starts
/// with the number of `read` and its first argument, fd 0. (Its SIGBUS bit in `SigCgt`
/// would not do: Rust's runtime installs a SIGBUS handler of its own before `main`.)
#[cfg(target_os = "linux")]
fn blocked_reading_stdin(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/syscall")).is_ok_and(|s| {
        let mut fields = s.split_whitespace();
        fields.next() == Some(&libc::SYS_read.to_string()) && fields.next() == Some("0x0")
    })
}

/// A fault on a mapped page (SIGBUS: another process truncated the file) ends the binary
/// with a message and exit code 2, not a crash without one. The signal is sent once the
/// binary is seen blocked reading its standard input, which `main()` reaches only after
/// installing its handler: an event, not a sleep that guesses how long that takes on a
/// loaded machine, and no race with a parse.
#[cfg(target_os = "linux")]
#[test]
fn a_bus_error_is_reported_with_exit_code_2() {
    use std::time::{Duration, Instant};

    let mut child = Command::new(env!("CARGO_BIN_EXE_graphcheck"))
        .current_dir(root())
        .args(["verify", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("graphcheck runs");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !blocked_reading_stdin(child.id()) {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            panic!(
                "graphcheck ended ({status}) before it was seen reading stdin: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        if Instant::now() >= deadline {
            child.kill().unwrap();
            panic!("graphcheck was not seen blocked reading stdin in 60 s (/proc/<pid>/syscall)");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let killed = Command::new("kill")
        .args(["-BUS", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{:?}: {stderr}", out.status);
    assert!(stderr.contains("SIGBUS"), "{stderr}");
    // No mapping holds the address a `kill` reports: the message names no file.
    assert!(stderr.contains("while reading an input file"), "{stderr}");
}

/// A mapped input truncated by another process before graphcheck read it (SIGBUS on the
/// first read) is named in the message, with exit code 2. The binary's test-only hook
/// `GRAPHCHECK_TEST_PAUSE_AFTER_MAP_MS` holds it after mapping until the file shrinks, and
/// the test truncates once `/proc/<pid>/maps` lists the file, so nothing is left to timing.
#[cfg(target_os = "linux")]
#[test]
fn a_mapped_file_truncated_meanwhile_is_named_with_exit_code_2() {
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read(root().join(SCENARIO).join("manifest.json")).unwrap();
    let big = padded(dir.path(), "truncated.json", &text);
    let mut child = Command::new(env!("CARGO_BIN_EXE_graphcheck"))
        .current_dir(root())
        .arg("verify")
        .arg(&big)
        .env("GRAPHCHECK_TEST_PAUSE_AFTER_MAP_MS", "60000")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("graphcheck runs");
    let listed = big.canonicalize().unwrap();
    let listed = listed.to_str().expect("a UTF-8 path");
    let maps = format!("/proc/{}/maps", child.id());
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&maps).is_ok_and(|m| m.contains(listed)) {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            panic!(
                "graphcheck ended ({status}) before the file was seen mapped: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(Instant::now() < deadline, "the file was never mapped");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(&big)
        .unwrap()
        .set_len(0)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{:?}: {stderr}", out.status);
    assert!(stderr.contains("SIGBUS"), "{stderr}");
    assert!(
        stderr.contains(&format!("while reading {}:", big.display())),
        "{stderr}"
    );
}
