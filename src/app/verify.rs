//! Verify: a manifest (and its live snapshot), a folder of ranks, or pairs of documents,
//! loaded, checked and ready to render in any format.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::app::commands::{Format, source};
use crate::app::folder::{DirError, no_folder, not_a_document};

use crate::app::ranks::{RankDoc, Ranks, group};
use crate::check::allow::Allowlist;
use crate::check::finding::Report;
use crate::check::ranks::{RankDocs, verify_ranks};
use crate::check::verify::LiveIndex;
use crate::codec::load::{Checked, LoadError, Source};
use crate::index::refs::Tables;
use crate::model::format::{DocKind, Live, Manifest};
use crate::present::fmt::{AddrFmt, RawAddrs};
use crate::present::normalize::Symbolizer;
use crate::present::rank_symbols::RankSymbolizer;
use crate::present::report::{render_json, render_markdown, render_table_fit};

/// A verified manifest: the documents and the report, ready to render in any format.
pub struct Verified {
    /// The manifest verified; with several ranks (`verify DIR`, pairs), the lowest rank's.
    /// Shared: a manifest parsed once may serve several verifies (the replay check's).
    pub manifest: Arc<Manifest>,
    pub tables: Arc<Tables>,
    pub live: Option<(Live, Tables)>,
    pub report: Report,
    /// With several ranks, every rank's manifest but `manifest`'s, by rank: `--normalized`
    /// names each finding's addresses with its own rank's manifest. Empty for one manifest.
    /// (The live snapshots of several ranks are dropped once verified.)
    pub other_ranks: Vec<(u32, Manifest)>,
    /// The JSON files of a folder that are no graphcheck document, skipped (`verify DIR`).
    pub skipped: Vec<Skipped>,
}

/// A JSON file of a folder that is no graphcheck document (a report written into the
/// folder, another tool's file: no `format_version` and `kind` at its top level), which
/// `verify DIR` skips rather than refusing the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub path: PathBuf,
    /// What the file lacks, in words (`its top level has no `kind``).
    pub why: String,
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is not a graphcheck document ({}): skipped",
            self.path.display(),
            self.why
        )
    }
}

/// Loads the manifest and the live snapshot (on two threads: parsing is most of the work)
/// and verifies them.
pub fn verify(
    manifest: &Source,
    live: Option<&Source>,
    allow: &Allowlist,
) -> Result<Verified, LoadError> {
    verify_parsed(manifest, None, live, allow)
}

/// [`verify`], with `manifest`'s text parsed and checked already where `parsed` is given
/// (by the caller that read the same text just before: the replay check's snapshot): it
/// is not parsed again. `manifest` still names it in messages.
pub fn verify_parsed(
    manifest: &Source,
    parsed: Option<(Arc<Manifest>, Arc<Tables>)>,
    live: Option<&Source>,
    allow: &Allowlist,
) -> Result<Verified, LoadError> {
    let (m, l) = std::thread::scope(|s| {
        // The live snapshot's lookups are built on its thread too: it is done loading well
        // before the manifest (a third of the size, no graphs).
        let live_job = live.map(|l| {
            s.spawn(move || {
                l.live_checked().map(|(l, t)| {
                    let index = LiveIndex::new(&l);
                    (l, t, index)
                })
            })
        });
        let m = match parsed {
            Some(parsed) => Ok(parsed),
            None => manifest
                .manifest_checked()
                .map(|(m, t)| (Arc::new(m), Arc::new(t))),
        };
        let l = live_job.map(|j| match j.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        });
        (m, l)
    });
    let names = (manifest.name(), live.map(Source::name));
    let (manifest, tables) = m?;
    let live = l.transpose()?;
    let report = crate::check::verify::verify_indexed(
        &manifest,
        &tables,
        live.as_ref().map(|(l, t, i)| (l, t, i)),
        allow,
    )
    .map_err(|e| e.in_files(names.0, names.1.unwrap_or(Path::new("live"))))?;
    let mut report = report;
    if let Some((l, _, _)) = &live {
        crate::plan::annotate(&mut report, &manifest, l);
    }
    Ok(Verified {
        manifest,
        tables,
        live: live.map(|(l, t, _)| (l, t)),
        report,
        other_ranks: Vec::new(),
        skipped: Vec::new(),
    })
}

/// Verifies the ranks of one run from their documents (as [`dir_documents`] lists them):
/// loads each (on a thread of its own), groups them by `producer.rank`
/// ([`crate::app::ranks::group`]), verifies each rank's manifest against its own
/// live snapshot, and the manifests against each other, into one report.
pub fn verify_dir(dir: &Path, paths: &[PathBuf], allow: &Allowlist) -> Result<Verified, DirError> {
    let mut docs = Vec::with_capacity(paths.len());
    let mut read = Vec::with_capacity(paths.len());
    let mut skipped = Vec::new();
    for (path, doc) in paths.iter().zip(load_each(paths)) {
        match doc {
            Ok(doc) => {
                docs.push(doc);
                read.push(path.clone());
            }
            Err(e) => match not_a_document(path, &e) {
                Some(why) => skipped.push(Skipped {
                    path: path.clone(),
                    why,
                }),
                None => return Err(e.into()),
            },
        }
    }
    let meta = rank_docs(&docs, &read);
    let ranks = group(&meta).map_err(|why| DirError::Ranks {
        dir: dir.to_path_buf(),
        why,
    })?;
    let mut v = verify_grouped(docs, &read, &ranks, allow)?;
    v.skipped = skipped;
    Ok(v)
}

/// Verifies the ranks of one run given as pairs, each a manifest and its live snapshot
/// (`verify M0 L0 M1 L1 …`, `graphcheck.verify([(m0, l0), (m1, l1)])`), as [`verify_dir`]
/// verifies a folder's documents (the same grouping, refusals and report), once each pair
/// is checked to be a manifest, then a live snapshot, of one rank: a snapshot is never
/// compared with another rank's manifest.
pub fn verify_pairs(pairs: &[(PathBuf, PathBuf)], allow: &Allowlist) -> Result<Verified, DirError> {
    no_folder(pairs.iter().flat_map(|(m, l)| [m, l]))?;
    let paths: Vec<PathBuf> = pairs
        .iter()
        .flat_map(|(m, l)| [m.clone(), l.clone()])
        .collect();
    let docs = load_all(&paths)?;
    let meta = rank_docs(&docs, &paths);
    for (i, pair) in meta.chunks_exact(2).enumerate() {
        let (m, l) = (&pair[0], &pair[1]);
        if m.kind != DocKind::Manifest {
            return Err(DirError::LiveAsManifest {
                pair: i + 1,
                path: m.path.to_path_buf(),
            });
        }
        if l.kind != DocKind::Live {
            return Err(DirError::ManifestAsLive {
                pair: i + 1,
                path: l.path.to_path_buf(),
            });
        }
        if m.rank != l.rank {
            return Err(DirError::PairRanks {
                manifest: m.path.to_path_buf(),
                manifest_rank: m.rank,
                live: l.path.to_path_buf(),
                live_rank: l.rank,
            });
        }
    }
    let ranks = group(&meta).map_err(|why| DirError::PairsRanks { why })?;
    Ok(verify_grouped(docs, &paths, &ranks, allow)?)
}

/// Loads and checks every document, each on a thread of its own.
fn load_all(paths: &[PathBuf]) -> Result<Vec<Checked>, LoadError> {
    load_each(paths).into_iter().collect()
}

/// Loads and checks each document on a thread of its own; one result per path.
fn load_each(paths: &[PathBuf]) -> Vec<Result<Checked, LoadError>> {
    std::thread::scope(|s| {
        let jobs: Vec<_> = paths
            .iter()
            .map(|p| s.spawn(move || source(p).checked()))
            .collect();
        jobs.into_iter()
            .map(|j| match j.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    })
}

/// What grouping by rank needs of each document.
fn rank_docs<'a>(docs: &[Checked], paths: &'a [PathBuf]) -> Vec<RankDoc<'a>> {
    docs.iter()
        .zip(paths)
        .map(|(d, path)| {
            let (kind, p) = match d {
                Checked::Manifest(m, _) => (DocKind::Manifest, &m.producer),
                Checked::Live(l, _) => (DocKind::Live, &l.producer),
            };
            RankDoc {
                path,
                kind,
                rank: p.rank,
                world_size: p.world_size,
            }
        })
        .collect()
}

/// Verifies documents grouped by rank (`docs[i]` read from `paths[i]`) into one report:
/// each rank's manifest against its own live snapshot, the manifests against each other.
fn verify_grouped(
    docs: Vec<Checked>,
    paths: &[PathBuf],
    ranks: &Ranks,
    allow: &Allowlist,
) -> Result<Verified, LoadError> {
    let manifest = |i: usize| match &docs[i] {
        Checked::Manifest(m, t) => (m, t),
        Checked::Live(..) => unreachable!("grouping put a live snapshot as a manifest"),
    };
    let live = |i: usize| match &docs[i] {
        Checked::Live(l, t) => (l, t),
        Checked::Manifest(..) => unreachable!("grouping put a manifest as a live snapshot"),
    };
    let rank_docs: Vec<RankDocs<'_>> = ranks
        .ranks
        .iter()
        .map(|r| {
            let (m, t) = manifest(r.manifest);
            RankDocs {
                rank: r.rank,
                manifest: m,
                tables: t,
                live: r.live.map(live),
            }
        })
        .collect();
    let report =
        verify_ranks(ranks.world_size, &rank_docs, ranks.missing.clone(), allow).map_err(|e| {
            let files = ranks
                .ranks
                .iter()
                .find(|r| r.rank == e.rank)
                .expect("the rank that failed was given");
            let live = files.live.map_or(Path::new("live"), |l| &paths[l]);
            e.source.in_files(&paths[files.manifest], live)
        })?;
    drop(rank_docs);
    // Each rank's manifest is kept for `--normalized`; the live snapshots go.
    let mut docs: Vec<Option<Checked>> = docs.into_iter().map(Some).collect();
    let mut manifests = ranks.ranks.iter().map(|r| match docs[r.manifest].take() {
        Some(Checked::Manifest(m, t)) => (r.rank, m, t),
        _ => unreachable!("grouping put a live snapshot as a manifest"),
    });
    let (_, manifest, tables) = manifests.next().expect("grouping gives at least one rank");
    Ok(Verified {
        manifest: Arc::new(manifest),
        tables: Arc::new(tables),
        live: None,
        report,
        other_ranks: manifests.map(|(rank, m, _)| (rank, m)).collect(),
        skipped: Vec::new(),
    })
}

impl Verified {
    /// The report in `format`; with `normalized`, every address (in sentences too) as its
    /// symbolic id, named by the manifest of the finding's own rank where there are several.
    pub fn render(&self, format: Format, normalized: bool) -> String {
        self.render_fit(format, normalized, None)
    }

    /// [`Verified::render`] with the table fitted to `width` columns (`None`: the fixed
    /// layout, for files, pipes and logs).
    pub fn render_fit(&self, format: Format, normalized: bool, width: Option<u16>) -> String {
        if normalized && self.report.world_size.is_some() {
            return self.render_ranks_normalized(format, width);
        }
        let sym = normalized.then(|| Symbolizer::for_manifest(&self.manifest));
        let fmt: &dyn AddrFmt = match &sym {
            Some(s) => s,
            None => &RawAddrs,
        };
        let text = match format {
            Format::Table => render_table_fit(&self.report, fmt, width),
            Format::Markdown => render_markdown(&self.report, fmt),
            Format::Json => render_json(&self.report),
        };
        match &sym {
            Some(s) => s.redact(&text),
            None => text,
        }
    }

    /// A report of several ranks with every finding's addresses named by its own rank's
    /// manifest (the report's ranks are in rank order; `manifest` is the lowest's).
    fn render_ranks_normalized(&self, format: Format, width: Option<u16>) -> String {
        let lowest = self.report.ranks.first().map_or(0, |r| r.rank);
        let manifests = std::iter::once((lowest, &*self.manifest))
            .chain(self.other_ranks.iter().map(|(rank, m)| (*rank, m)));
        let ranks =
            RankSymbolizer::new(manifests.map(|(rank, m)| (rank, Symbolizer::for_manifest(m))));
        let (report, symbols) = ranks.normalize(&self.report);
        match format {
            Format::Table => render_table_fit(&report, &symbols, width),
            Format::Markdown => render_markdown(&report, &symbols),
            Format::Json => symbols.redact(&render_json(&report)),
        }
    }
}
