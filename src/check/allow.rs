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
use crate::document::owner_path::Glob;

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
#[serde(deny_unknown_fields)]
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
        let text = std::fs::read_to_string(path).map_err(|source| AllowError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Allowlist::parse(&text).map_err(|message| AllowError::Parse {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parses TOML text; the error says where and what.
    pub fn parse(text: &str) -> Result<Allowlist, String> {
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
                    for k in ks {
                        // In kernel names `*` spans anything: they have no hops.
                        let g = Glob::new(&k.replace('*', "**"))
                            .map_err(|err| format!("allow[{i}].kernel: {err}"))?;
                        compiled.push((g, k));
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
