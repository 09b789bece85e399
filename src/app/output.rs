//! Writing an output file without harming what its path names: a regular file is replaced
//! atomically, a device, FIFO or `/dev/stdout` is written in place, a directory is refused,
//! and an output that is one of the inputs is refused before anything is written.
//!
//! Renaming a temporary file over a path is right for a regular file (a reader sees the old
//! contents or the new, never a part) and wrong for everything else: it would replace
//! `/dev/null` or a FIFO with a regular file, cut a symlink loose from its target, and turn
//! `/proc/self/fd/1` into a file nobody reads. So the path is resolved first, and only a
//! regular file (or nothing yet) at the end of it is replaced by rename.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// How many symbolic links are followed before giving up, as Linux's `MAXSYMLINKS`.
const MAX_LINKS: usize = 40;

/// What writing to a path means, once its symbolic links are followed.
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    /// A regular file, or nothing yet: replace `target` atomically, keeping `mode` (the
    /// permission bits of the file replaced; `None` for a new file).
    Replace {
        target: PathBuf,
        mode: Option<u32>,
    },
    /// A device, FIFO, socket or a descriptor of this process (`/proc/self/fd/N`,
    /// `/dev/stdout`): open it and write. `truncate` only where the open file is a regular
    /// file reached through `/proc` (a shell's `> file` behind `/dev/stdout`), since a
    /// device or FIFO cannot be truncated.
    InPlace {
        path: PathBuf,
        truncate: bool,
    },
    /// This process's own standard output or error (`/dev/stdout`, `/proc/self/fd/2`):
    /// written through the handle it already holds, which works where reopening does not
    /// (a socket cannot be opened by path) and keeps the shell's `>>` appending.
    Stdout,
    Stderr,
}

/// Writes `bytes` to `path` without harming what the path names.
///
/// - A regular file, or a path that does not exist yet, is replaced atomically: a temporary
///   file in the same directory, synced, then renamed over it. It keeps the permission bits
///   of the file it replaces; a new file gets 0644.
/// - A symbolic link is followed to its final target, which is handled by these rules; the
///   link itself stays.
/// - A character or block device, a FIFO, a socket, or a path through `/proc` (such as
///   `/proc/self/fd/3`) is opened and written in place; this process's own standard output
///   or error (`/dev/stdout`, `/proc/self/fd/2`) is written through its handle.
/// - A directory, or a link to one, is an error of kind [`io::ErrorKind::IsADirectory`].
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    match plan(path)? {
        Plan::Replace { target, mode } => {
            if mode.is_some() {
                writable(&target)?;
            }
            replace(&target, mode, bytes)
        }
        Plan::Stdout => write_stdio(&mut io::stdout().lock(), bytes),
        Plan::Stderr => write_stdio(&mut io::stderr().lock(), bytes),
        Plan::InPlace { path, truncate } => {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .truncate(truncate)
                .open(&path)?;
            f.write_all(bytes)?;
            f.flush()
        }
    }
}

fn write_stdio(out: &mut dyn Write, bytes: &[u8]) -> io::Result<()> {
    out.write_all(bytes)?;
    out.flush()
}

/// Follows `path`'s symbolic links to what is finally there, and decides how to write it.
fn plan(path: &Path) -> io::Result<Plan> {
    let mut cur = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        let md = match std::fs::symlink_metadata(&cur) {
            Ok(md) => md,
            // A new file, or the missing target of a dangling link: created by rename (a
            // missing directory is reported when the temporary file cannot be made there).
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Plan::Replace {
                    target: cur,
                    mode: None,
                });
            }
            Err(e) => return Err(e),
        };
        if md.is_symlink() {
            // A link under /proc (`/proc/self/fd/1`, where `/dev/stdout` leads) names an
            // open file of a process, not a path: its text may be `pipe:[123]`. Only opening
            // it reaches the file, so it is written in place, whatever it is.
            if let Some(dir) = proc_dir(&cur) {
                if dir == Path::new(&format!("/proc/{}/fd", std::process::id())) {
                    match cur.file_name().and_then(|n| n.to_str()) {
                        Some("1") => return Ok(Plan::Stdout),
                        Some("2") => return Ok(Plan::Stderr),
                        _ => {}
                    }
                }
                let target = std::fs::metadata(&cur)?;
                if target.is_dir() {
                    return Err(is_a_directory(path));
                }
                return Ok(Plan::InPlace {
                    path: cur,
                    truncate: target.is_file(),
                });
            }
            let link = std::fs::read_link(&cur)?;
            cur = match cur.parent() {
                Some(dir) if link.is_relative() => dir.join(link),
                _ => link,
            };
            continue;
        }
        if md.is_dir() {
            return Err(is_a_directory(path));
        }
        if md.is_file() {
            return Ok(Plan::Replace {
                target: cur,
                mode: Some(mode_of(&md)),
            });
        }
        // A character or block device, a FIFO or a socket: renaming over it would replace
        // it with a regular file.
        return Ok(Plan::InPlace {
            path: cur,
            truncate: false,
        });
    }
    Err(io::Error::other(format!(
        "too many levels of symbolic links at {}",
        path.display()
    )))
}

/// The directory holding `link`, links followed (`/dev/fd` is `/proc/self/fd`, which is
/// `/proc/<pid>/fd`), where it lies under `/proc`.
fn proc_dir(link: &Path) -> Option<PathBuf> {
    let dir = match link.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::canonicalize(dir)
        .ok()
        .filter(|d| d.starts_with("/proc"))
}

fn is_a_directory(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::IsADirectory,
        format!("{} is a directory", path.display()),
    )
}

#[cfg(unix)]
fn mode_of(md: &std::fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    md.permissions().mode() & 0o7777
}

#[cfg(not(unix))]
fn mode_of(_: &std::fs::Metadata) -> u32 {
    0o644
}

/// Refuses to replace a file its caller could not write (`> file` in a shell would fail):
/// renaming over it needs only the folder's permission, so a world-writable folder would
/// let anyone replace a read-only file of someone else's. Asked by opening it for writing,
/// without truncating or writing, which is the same question the kernel answers for `>`.
fn writable(target: &Path) -> io::Result<()> {
    match std::fs::OpenOptions::new().write(true).open(target) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not writable by this user: refusing to replace it",
                target.display()
            ),
        )),
        Err(e) => Err(e),
    }
}

/// An error of creating the temporary file beside `target`, said of `target`: the
/// temporary file's own name (`.graphcheck-….tmp`) means nothing to the user.
fn beside(target: &Path, dir: &Path, e: io::Error) -> io::Error {
    let why = e.raw_os_error().map_or_else(
        || e.kind().to_string(),
        |n| io::Error::from_raw_os_error(n).to_string(),
    );
    io::Error::new(
        e.kind(),
        format!(
            "cannot write {}: no file can be made in {} to replace it atomically: {why}",
            target.display(),
            dir.display()
        ),
    )
}

/// Replaces the regular file (or nothing) at `target` by a temporary file renamed over it.
fn replace(target: &Path, mode: Option<u32>, bytes: &[u8]) -> io::Result<()> {
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    // Said before the temporary file's own error, which names the temporary file.
    if let Err(e) = std::fs::metadata(dir)
        && e.kind() == io::ErrorKind::NotFound
    {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("the folder {} does not exist", dir.display()),
        ));
    }
    let mut tmp = tempfile::Builder::new()
        .prefix(".graphcheck-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| beside(target, dir, e))?;
    tmp.write_all(bytes)?;
    // A temporary file is private (0600); the result gets the mode of the file it replaces,
    // or the usual mode of a new file.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(mode.unwrap_or(0o644)))?;
    }
    #[cfg(not(unix))]
    let _ = mode;
    tmp.as_file().sync_all()?;
    tmp.persist(target).map_err(|e| e.error)?;
    Ok(())
}

/// An output path that names one of the inputs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the output {} is the {role} {}: refusing to overwrite an input",
    output.display(),
    input.display()
)]
pub struct OutputIsInput {
    pub output: PathBuf,
    /// What the input is (`manifest`, `live snapshot`, `allowlist`).
    pub role: String,
    pub input: PathBuf,
}

/// Refuses an `output` that is the same regular file as one of `inputs` (role, path): after
/// following links, the same device and inode on Unix. Call it before writing anything.
/// An output that does not exist yet cannot be an input; a terminal or pipe both read and
/// written (`-` and `/dev/stdout` on one terminal) loses nothing, so only a regular file is
/// refused.
pub fn refuse_inputs(output: &Path, inputs: &[(&str, &Path)]) -> Result<(), OutputIsInput> {
    if !std::fs::metadata(output).is_ok_and(|m| m.is_file()) {
        return Ok(());
    }
    for (role, input) in inputs {
        if same_file(output, input) {
            return Err(OutputIsInput {
                output: output.to_path_buf(),
                role: (*role).to_string(),
                input: input.to_path_buf(),
            });
        }
    }
    Ok(())
}

/// Whether `a` and `b` both exist and are the same file, links followed.
pub fn same_file(a: &Path, b: &Path) -> bool {
    let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        ma.dev() == mb.dev() && ma.ino() == mb.ino()
    }
    #[cfg(not(unix))]
    {
        let _ = (ma, mb);
        matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(x), Ok(y)) if x == y
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomic_replaces_whole_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.json");
        write_atomic(&p, b"first").unwrap();
        write_atomic(&p, b"second").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"second");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&p), 0o644);
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
            write_atomic(&p, b"third").unwrap();
            assert_eq!(mode(&p), 0o640);
        }
    }

    /// Regression: a relative link is resolved against the link's directory, and a chain of
    /// links ends at the file they lead to, which is replaced while every link stays.
    #[cfg(unix)]
    #[test]
    fn link_chains_resolve_to_their_final_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let file = dir.path().join("sub/real.txt");
        std::fs::write(&file, b"old").unwrap();
        std::os::unix::fs::symlink("real.txt", dir.path().join("sub/one")).unwrap();
        std::os::unix::fs::symlink("sub/one", dir.path().join("two")).unwrap();
        let two = dir.path().join("two");
        assert_eq!(
            plan(&two).unwrap(),
            Plan::Replace {
                target: dir.path().join("sub/real.txt"),
                mode: Some(mode_of(&std::fs::metadata(&file).unwrap())),
            }
        );
        write_atomic(&two, b"new").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"new");
        assert!(std::fs::symlink_metadata(&two).unwrap().is_symlink());
        assert!(
            std::fs::symlink_metadata(dir.path().join("sub/one"))
                .unwrap()
                .is_symlink()
        );
    }

    /// Regression: a dangling link creates its target (as `>` does) and stays a link.
    #[cfg(unix)]
    #[test]
    fn a_dangling_link_creates_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("made.txt", &link).unwrap();
        write_atomic(&link, b"x").unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(std::fs::read(dir.path().join("made.txt")).unwrap(), b"x");
    }

    /// Regression: a loop of links is an error, not an endless walk.
    #[cfg(unix)]
    #[test]
    fn a_link_loop_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        let e = write_atomic(&a, b"x").unwrap_err();
        assert!(e.to_string().contains("too many levels"), "{e}");
    }

    /// Regression: `/proc/self/fd/N` is opened in place, never renamed over.
    #[cfg(target_os = "linux")]
    #[test]
    fn proc_descriptors_are_written_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("held.txt");
        let f = std::fs::File::create(&p).unwrap();
        let canonical = std::fs::canonicalize(&p).unwrap();
        let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        let before = ino(&p);
        // This process's descriptor for the file, as a shell's `/dev/stdout` would be.
        let fd = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|l| std::fs::read_link(l).is_ok_and(|t| t == canonical))
            .expect("the open file is among /proc/self/fd");
        write_atomic(&fd, b"through the descriptor").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"through the descriptor");
        assert_eq!(ino(&p), before, "the file was replaced, not written");
        drop(f);
    }

    /// Regression: this process's standard output and error, by any of their names, are
    /// written through the handles it holds (a socket cannot be reopened by path).
    #[cfg(target_os = "linux")]
    #[test]
    fn own_standard_streams_are_written_through_their_handles() {
        for (p, want) in [
            ("/dev/stdout", Plan::Stdout),
            ("/dev/fd/1", Plan::Stdout),
            ("/proc/self/fd/1", Plan::Stdout),
            ("/dev/stderr", Plan::Stderr),
            ("/proc/self/fd/2", Plan::Stderr),
        ] {
            assert_eq!(plan(Path::new(p)).unwrap(), want, "{p}");
        }
    }

    /// Regression: a missing folder was named by the temporary file that could not be made
    /// in it (`No such file or directory … at path "/d/.graphcheck-5k8Xk2.tmp"`).
    #[test]
    fn a_missing_folder_is_named_not_the_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no/such");
        let e = write_atomic(&missing.join("x.txt"), b"x").unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("the folder {} does not exist", missing.display())
        );
    }

    #[test]
    fn same_file_and_refuse_inputs() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.json");
        std::fs::write(&a, b"{}").unwrap();
        let b = dir.path().join("b.json");
        assert!(same_file(&a, &a));
        assert!(!same_file(&a, &b), "a missing file is no input");
        std::fs::write(&b, b"{}").unwrap();
        assert!(!same_file(&a, &b));
        let e = refuse_inputs(&a, &[("live snapshot", &b), ("manifest", &a)]).unwrap_err();
        assert_eq!(e.role, "manifest");
        assert!(
            e.to_string().ends_with("refusing to overwrite an input"),
            "{e}"
        );
        assert!(refuse_inputs(&b, &[("manifest", &a)]).is_ok());
    }
}
