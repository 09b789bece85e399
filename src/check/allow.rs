//! The allowlist: owner-path globs (or kernel-name patterns), each with the finding kinds it
//! silences and a reason.
//! An entry that silences nothing is itself reported (a warning; an error under
//! `--deny-unused-allow`), so the list cannot rot.
//!
//! ```toml
//! [[allow]]
//! path = "model.layers[*].self_attn.impl.workspace"
//! kinds = ["unregistered"]          # optional; every kind when absent
//! reason = "per-step scratch, rewritten before every read"
//!
//! [[allow]]
//! kernels = ["nvjet_*", "*gemm*", "*splitKreduce*", "memset"]   # or one `kernel = "…"`
//! kinds = ["unowned"]
//! reason = "torch's cuBLAS workspace: scratch torch keeps for the whole process"
//! ```
//!
//! A kernel entry is how an `unowned` finding, which has no owner path, is allowed: it
//! matches a finding every one of whose holding kernels matches one of the patterns (`*`
//! matches any run of characters there).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::check::finding::{Allowed, Finding, FindingKind, Severity};
use crate::model::owner_path::Glob;

/// Why an allowlist could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AllowError {
    #[error("failed to read allowlist {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: invalid allowlist: {message}", path.display())]
    Parse { path: PathBuf, message: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    allow: Vec<RawEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an allowlist entry")]
struct RawEntry {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    kernel: Option<String>,
    #[serde(default)]
    kernels: Option<Vec<String>>,
    #[serde(default)]
    kinds: Option<Vec<FindingKind>>,
    reason: String,
}

/// What an entry matches.
#[derive(Clone, Debug)]
pub enum Target {
    /// Any owner path of the finding.
    Path(Glob),
    /// Every kernel holding the finding's address matches one of the patterns (compiled,
    /// and as written).
    Kernel(Vec<(Glob, String)>),
}

/// One entry.
#[derive(Clone, Debug)]
pub struct Entry {
    pub target: Target,
    /// `None`: every kind.
    pub kinds: Option<Vec<FindingKind>>,
    pub reason: String,
}

impl Entry {
    fn covers(&self, kind: FindingKind) -> bool {
        self.kinds.as_ref().is_none_or(|k| k.contains(&kind))
    }

    fn matches(&self, f: &Finding) -> bool {
        if !self.covers(f.kind) || f.kind == FindingKind::UnusedAllow {
            return false;
        }
        match &self.target {
            Target::Path(g) => f.owners.iter().any(|o| g.is_match(&o.path)),
            Target::Kernel(patterns) => {
                !f.kernels.is_empty()
                    && f.kernels
                        .iter()
                        .all(|k| patterns.iter().any(|(g, _)| g.is_match(&k.name)))
            }
        }
    }

    /// How the entry is written: the path glob, or `kernel:` and the kernel pattern.
    pub fn describe(&self) -> String {
        match &self.target {
            Target::Path(g) => g.as_str().to_string(),
            Target::Kernel(patterns) => {
                let written: Vec<&str> = patterns.iter().map(|(_, w)| w.as_str()).collect();
                format!("kernel:{}", written.join("|"))
            }
        }
    }
}

/// A parsed allowlist; the default allows nothing.
#[derive(Clone, Debug, Default)]
pub struct Allowlist {
    pub entries: Vec<Entry>,
    /// Whether an entry that allowed nothing fails the run (`--deny-unused-allow`). By
    /// default it is a warning: an entry for a kernel this run did not capture must not
    /// turn a clean run red.
    pub deny_unused: bool,
}

impl Allowlist {
    pub fn load(path: &Path) -> Result<Allowlist, AllowError> {
        let bytes = std::fs::read(path).map_err(|source| AllowError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let parse = |message| AllowError::Parse {
            path: path.to_path_buf(),
            message,
        };
        let text = std::str::from_utf8(&bytes).map_err(|e| parse(not_utf8(&bytes, e)))?;
        Allowlist::parse(text).map_err(parse)
    }

    /// Parses TOML text; the error says where and what.
    pub fn parse(text: &str) -> Result<Allowlist, String> {
        // As for documents (`codec::load`): a file is the same text to every reader.
        if text.starts_with('\u{feff}') {
            return Err(
                "the file starts with a UTF-8 byte-order mark, which graphcheck does \
                        not read: save it as UTF-8 without one"
                    .into(),
            );
        }
        let file: File = toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())?;
        Allowlist::from_raw(file.allow)
    }

    /// The entries as data, a JSON array of objects with the keys of a TOML entry (how the
    /// Python API hands over a list of dicts); errors name the entry and key (`allow[2]`).
    pub fn from_json(text: &str) -> Result<Allowlist, String> {
        let mut de = serde_json::Deserializer::from_str(text);
        let raw: Vec<RawEntry> = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let at = e.path().to_string();
            let inner = e.into_inner().to_string();
            // serde_json appends " at line L column C" of the generated JSON: not the
            // caller's text, so left out.
            let inner = inner
                .split(" at line ")
                .next()
                .unwrap_or(&inner)
                .to_string();
            if at == "." {
                inner
            } else {
                format!(
                    "allow{}: {inner}",
                    if at.starts_with('[') {
                        at
                    } else {
                        format!(".{at}")
                    }
                )
            }
        })?;
        Allowlist::from_raw(raw)
    }

    fn from_raw(raw: Vec<RawEntry>) -> Result<Allowlist, String> {
        let mut entries = Vec::with_capacity(raw.len());
        for (i, e) in raw.into_iter().enumerate() {
            let patterns: Option<Vec<String>> = match (&e.kernel, &e.kernels) {
                (Some(k), None) => Some(vec![k.clone()]),
                (None, Some(ks)) if !ks.is_empty() => Some(ks.clone()),
                (None, Some(_)) => {
                    return Err(format!(
                        "allow[{i}].kernels: an empty list matches no kernel"
                    ));
                }
                (None, None) => None,
                (Some(_), Some(_)) => {
                    return Err(format!("allow[{i}]: give `kernel` or `kernels`, not both"));
                }
            };
            let target = match (&e.path, patterns) {
                (Some(p), None) => Target::Path(
                    Glob::owner_path(p).map_err(|err| format!("allow[{i}].path: {err}"))?,
                ),
                (None, Some(ks)) => {
                    let mut compiled = Vec::with_capacity(ks.len());
                    for (j, k) in ks.into_iter().enumerate() {
                        let key = match e.kernel {
                            Some(_) => format!("allow[{i}].kernel"),
                            None => format!("allow[{i}].kernels[{j}]"),
                        };
                        compiled.push((kernel_glob(&k).map_err(|why| format!("{key}: {why}"))?, k));
                    }
                    Target::Kernel(compiled)
                }
                _ => {
                    return Err(format!(
                        "allow[{i}]: give exactly one of `path` (an owner-path glob) or `kernel`/`kernels` (kernel-name patterns)"
                    ));
                }
            };
            if e.reason.trim().is_empty() {
                return Err(format!(
                    "allow[{i}].reason: every entry says why it is allowed"
                ));
            }
            if let Some(k) = &e.kinds
                && k.is_empty()
            {
                return Err(format!(
                    "allow[{i}].kinds: an empty list allows nothing; leave it out to allow every kind"
                ));
            }
            if let Some(j) = e
                .kinds
                .iter()
                .flatten()
                .position(|&k| k == FindingKind::UnusedAllow)
            {
                return Err(format!(
                    "allow[{i}].kinds[{j}]: `unused_allow` is reported about the allowlist itself, and no entry can allow it"
                ));
            }
            entries.push(Entry {
                target,
                kinds: e.kinds,
                reason: e.reason,
            });
        }
        Ok(Allowlist {
            entries,
            deny_unused: false,
        })
    }

    /// The same list, with unused entries failing the run or not.
    pub fn deny_unused(mut self, deny: bool) -> Allowlist {
        self.deny_unused = deny;
        self
    }

    /// Splits findings into reported and allowed, and appends an `unused_allow` finding for
    /// each entry that allowed nothing although one of its kinds was checked: a warning,
    /// or an error where [`Allowlist::deny_unused`] is set.
    pub fn apply(
        &self,
        findings: Vec<Finding>,
        checked: &[FindingKind],
    ) -> (Vec<Finding>, Vec<Allowed>) {
        let mut used = vec![false; self.entries.len()];
        let mut reported = Vec::new();
        let mut allowed = Vec::new();
        for f in findings {
            let hit = self.entries.iter().enumerate().find(|(_, e)| e.matches(&f));
            match hit {
                Some((i, e)) => {
                    used[i] = true;
                    allowed.push(Allowed {
                        allowed_by: e.describe(),
                        reason: e.reason.clone(),
                        finding: f,
                    });
                }
                None => reported.push(f),
            }
        }
        for (e, used) in self.entries.iter().zip(used) {
            let relevant = match &e.kinds {
                None => true,
                Some(k) => k.iter().any(|k| checked.contains(k)),
            };
            if !used && relevant {
                reported.push(Finding::about(
                    FindingKind::UnusedAllow,
                    if self.deny_unused {
                        Severity::Error
                    } else {
                        Severity::Warning
                    },
                    e.describe(),
                    format!(
                        "allowed nothing in this run; remove it if the cause is gone (reason given: {})",
                        e.reason
                    ),
                ));
            }
        }
        (reported, allowed)
    }
}

/// A kernel-name pattern, in which `*` spans anything (kernel names have no hops); the error
/// names the pattern as written.
fn kernel_glob(pattern: &str) -> Result<Glob, String> {
    if pattern.is_empty() {
        return Err("an empty kernel pattern matches no kernel".into());
    }
    Glob::new(&pattern.replace('*', "**")).map_err(|e| {
        // Each `*` was written twice: the bytes as written that end at or before `e.at`.
        let at = pattern
            .bytes()
            .scan(0, |doubled, b| {
                *doubled += if b == b'*' { 2 } else { 1 };
                Some(*doubled)
            })
            .take_while(|&doubled| doubled <= e.at)
            .count();
        format!("invalid kernel pattern {pattern:?} at byte {at}: {}", e.why)
    })
}

/// Where the first byte that is not UTF-8 is, in the words of a TOML error's position.
fn not_utf8(bytes: &[u8], e: std::str::Utf8Error) -> String {
    let at = e.valid_up_to();
    let line_start = bytes[..at]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |n| n + 1);
    let line = 1 + bytes[..line_start].iter().filter(|&&b| b == b'\n').count();
    // The bytes before `at` are UTF-8: the column counts characters, as TOML's do.
    let column = 1 + String::from_utf8_lossy(&bytes[line_start..at])
        .chars()
        .count();
    format!("not valid UTF-8 at line {line}, column {column} (byte offset {at})")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a malformed path glob was accepted, and showed only as `unused_allow`.
    #[test]
    fn a_malformed_path_glob_names_the_file_entry_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("allow.toml");
        for (glob, why) in [
            (
                "model.[[",
                "at byte 6: expected an attribute name after '.'",
            ),
            (
                "model..x",
                "at byte 6: expected an attribute name after '.'",
            ),
            (
                "model.layers[*",
                "at byte 12: unterminated index: expected ']'",
            ),
        ] {
            let entry = |g: &str| {
                format!(
                    "[[allow]]\npath = \"x\"\nreason = \"r\"\n\n[[allow]]\npath = \"{g}\"\nreason = \"r\"\n"
                )
            };
            std::fs::write(&file, entry(glob)).unwrap();
            let e = Allowlist::load(&file).unwrap_err().to_string();
            let want = format!(
                "{}: invalid allowlist: allow[1].path: invalid owner path {glob:?} {why}",
                file.display()
            );
            assert_eq!(e, want);
        }
        // Wildcards stand for names and indexes wherever they may be.
        for ok in [
            "model.layers[*].*",
            "**.workspace",
            "model.*_proj[*][\"k*\"]",
            "**",
        ] {
            Glob::owner_path(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    /// Regression (issue 25): `kernel = ""` and `kernels = ["a", ""]` said "invalid owner
    /// path", and named `allow[0].kernel` for either.
    #[test]
    fn a_bad_kernel_pattern_is_named_as_one_with_its_element() {
        let toml = |key: &str| Allowlist::parse(&format!("[[allow]]\n{key}\nreason = \"r\"\n"));
        assert_eq!(
            toml("kernel = \"\"").unwrap_err(),
            "allow[0].kernel: an empty kernel pattern matches no kernel"
        );
        assert_eq!(
            toml("kernels = [\"a\", \"\"]").unwrap_err(),
            "allow[0].kernels[1]: an empty kernel pattern matches no kernel"
        );
        let e = Allowlist::from_json(r#"[{"kernels": [""], "reason": "r"}]"#).unwrap_err();
        assert_eq!(
            e,
            "allow[0].kernels[0]: an empty kernel pattern matches no kernel"
        );
        // Other faults name the pattern as written, at its own byte offsets.
        let long = format!("*{}", ".k".repeat(64));
        assert_eq!(
            toml(&format!("kernels = [\"a\", \"{long}\"]")).unwrap_err(),
            format!(
                "allow[0].kernels[1]: invalid kernel pattern {long:?} at byte 127: a glob has at \
                 most 63 `.`"
            )
        );
    }

    /// Regression (issue 25): a file that is not UTF-8 said only "failed to read
    /// allowlist", with no position.
    #[test]
    fn an_allowlist_not_utf8_names_the_line_column_and_byte() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("allow.toml");
        std::fs::write(
            &file,
            b"[[allow]]\npath = \"\xc3\xa9\xff\"\nreason = \"r\"\n",
        )
        .unwrap();
        assert_eq!(
            Allowlist::load(&file).unwrap_err().to_string(),
            format!(
                "{}: invalid allowlist: not valid UTF-8 at line 2, column 10 (byte offset 20)",
                file.display()
            )
        );
    }

    /// Regression (issue 25): an allowlist was read past a UTF-8 byte-order mark, which a
    /// document is refused for.
    #[test]
    fn an_allowlist_with_a_byte_order_mark_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("allow.toml");
        std::fs::write(&file, "\u{feff}[[allow]]\npath = \"a\"\nreason = \"r\"\n").unwrap();
        assert_eq!(
            Allowlist::load(&file).unwrap_err().to_string(),
            format!(
                "{}: invalid allowlist: the file starts with a UTF-8 byte-order mark, which \
                 graphcheck does not read: save it as UTF-8 without one",
                file.display()
            )
        );
    }

    /// Regression (issue 25): `kinds = ["unused_allow"]` was accepted, and could allow
    /// nothing.
    #[test]
    fn an_entry_cannot_allow_unused_allow() {
        let want = "allow[0].kinds[1]: `unused_allow` is reported about the allowlist itself, \
                    and no entry can allow it";
        let toml =
            "[[allow]]\npath = \"a\"\nkinds = [\"stale\", \"unused_allow\"]\nreason = \"r\"\n";
        assert_eq!(Allowlist::parse(toml).unwrap_err(), want);
        let json = r#"[{"path": "a", "kinds": ["stale", "unused_allow"], "reason": "r"}]"#;
        assert_eq!(Allowlist::from_json(json).unwrap_err(), want);
    }

    /// Regression: a value that is no entry was "expected struct RawEntry", a Rust name.
    #[test]
    fn a_value_that_is_no_entry_is_said_in_words() {
        let e = Allowlist::parse("allow = [1]\n").unwrap_err();
        assert!(
            e.ends_with("invalid type: integer `1`, expected an allowlist entry"),
            "{e}"
        );
        assert_eq!(
            Allowlist::from_json("[1]").unwrap_err(),
            "allow[0]: invalid type: integer `1`, expected an allowlist entry"
        );
    }

    #[test]
    fn entries_as_data_read_like_toml_and_name_entry_and_key() {
        let a = Allowlist::from_json(
            r#"[{"path": "model.**.workspace", "kinds": ["unowned"], "reason": "scratch"},
                {"kernels": ["gemm*"], "reason": "r"}]"#,
        )
        .unwrap();
        assert_eq!(a.entries.len(), 2);
        assert_eq!(a.entries[1].describe(), "kernel:gemm*");
        let e = Allowlist::from_json(r#"[{"path": "a", "reason": "r"}, {"path": "b", "x": 1}]"#)
            .unwrap_err();
        assert!(e.starts_with("allow[1].x: unknown field `x`"), "{e}");
        let e = Allowlist::from_json(r#"[{"path": "a", "kinds": ["nope"], "reason": "r"}]"#)
            .unwrap_err();
        assert!(
            e.starts_with("allow[0].kinds[0]: unknown variant `nope`"),
            "{e}"
        );
        let e = Allowlist::from_json(r#"[{"path": "a", "reason": " "}]"#).unwrap_err();
        assert_eq!(e, "allow[0].reason: every entry says why it is allowed");
        assert!(Allowlist::from_json("{}").is_err());
    }

    #[test]
    fn parses_entries_and_rejects_bad_ones() {
        let a = Allowlist::parse(
            r#"
            [[allow]]
            path = "model.layers[*].ws"
            kinds = ["unregistered", "stale"]
            reason = "scratch"
            "#,
        )
        .unwrap();
        assert_eq!(a.entries.len(), 1);
        assert!(a.entries[0].covers(FindingKind::Stale));
        assert!(!a.entries[0].covers(FindingKind::Drifted));

        let err = Allowlist::parse("[[allow]]\npath = \"a\"\n").unwrap_err();
        assert!(err.contains("reason"), "{err}");
        let err =
            Allowlist::parse("[[allow]]\npath = \"a\"\nreason = \"x\"\nkinds = [\"bogus\"]\n")
                .unwrap_err();
        assert!(err.contains("bogus"), "{err}");
        let err =
            Allowlist::parse("[[allow]]\npath = \"a\"\nreason = \"x\"\nkind = []\n").unwrap_err();
        assert!(err.contains("unknown field"), "{err}");
        let err = Allowlist::parse("[[allow]\n").unwrap_err();
        assert!(err.contains("line 1"), "{err}");
        let err = Allowlist::parse("[[allow]]\nreason = \"x\"\n").unwrap_err();
        assert!(err.contains("exactly one of `path`"), "{err}");
        let err = Allowlist::parse("[[allow]]\nkernels = []\nreason = \"x\"\n").unwrap_err();
        assert!(err.contains("empty list"), "{err}");
        let err = Allowlist::parse("[[allow]]\npath = \"a\"\nkernel = \"k\"\nreason = \"x\"\n")
            .unwrap_err();
        assert!(err.contains("exactly one of `path`"), "{err}");
    }
}
