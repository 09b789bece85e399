//! Verify: classify every touched storage view of a manifest, alone (capture-time checks)
//! or against a live snapshot (all checks). The rules are `docs/findings.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::context::{Ctx, Subject, TouchIndex, TouchRef, persistent, touch_counts};
pub use super::live::LiveIndex;
use super::live::live_checks;
use super::{superseded, unowned};
use crate::check::allow::Allowlist;
use crate::check::finding::{Finding, FindingKind, REPORT_VERSION, Report, Severity};
use crate::check::pair::{PairError, check_pair_probed};
use crate::index::refs::{Tables, check_live, check_manifest};
use crate::model::format::{Addr, Contents, Live, Manifest, SleepPolicy, TensorId, ViewKey};

/// Why verify could not run: an inconsistent document handed in memory, or two documents
/// that do not belong together.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    #[error("invalid manifest at `{}`: {}", .0.json_path, .0.message)]
    Manifest(crate::index::refs::Invalid),
    #[error("invalid live snapshot at `{}`: {}", .0.json_path, .0.message)]
    Live(crate::index::refs::Invalid),
    #[error("the live snapshot cannot be verified against the manifest: {0}")]
    Pair(PairError),
}

/// Verifies a manifest, alone or against a live snapshot, under an allowlist. Checks both
/// documents first, so an inconsistent one is an error, never a panic.
pub fn verify(m: &Manifest, live: Option<&Live>, allow: &Allowlist) -> Result<Report, VerifyError> {
    let mt = check_manifest(m).map_err(VerifyError::Manifest)?;
    let lt = live
        .map(|l| check_live(l).map_err(VerifyError::Live))
        .transpose()?;
    verify_checked(m, &mt, live.zip(lt.as_ref()), allow).map_err(VerifyError::Pair)
}

/// Every captured address of the touches no owner explains (the `unowned` findings' touches)
/// that lay in an allocation of a pool the manifest declares, sorted, each once: where the
/// memory graphs read without an owner is, for digesting it
/// ([`crate::model::format::RangeDigest`]). Memory of no declared pool is left out:
/// torch's default pool holds scratch the graphs write at every replay (cuBLAS's
/// workspace), whose contents change without anything being wrong, and no sleep releases it.
pub fn unexplained_addresses(m: &Manifest, mt: &Tables) -> Vec<Addr> {
    let (ctx, bare, subjects, ()) = context(m, mt, || (), false);
    let mut addrs: Vec<Addr> = unowned::groups(&ctx, &bare, &subjects)
        .iter()
        .filter(|g| g.in_declared_pool(m))
        .flat_map(|g| g.addresses(m))
        .collect();
    addrs.sort_unstable();
    addrs.dedup();
    addrs
}

/// The check context of a checked manifest, its touches that name no tensor, and its
/// subjects, with what `beside` returns. On a machine of several cores and a manifest of
/// [`PARALLEL_NODES`] nodes or more, the touch index is filled on a second thread while
/// this one groups the subjects, and `beside` (when `beside_thread`) runs on a third.
fn context<'m, R: Send>(
    m: &'m Manifest,
    mt: &'m Tables,
    beside: impl FnOnce() -> R + Send,
    beside_thread: bool,
) -> (Ctx<'m>, Vec<TouchRef>, Vec<Subject<'m>>, R) {
    let nodes: usize = m.graphs.iter().map(|g| g.nodes.len()).sum();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    context_on(
        m,
        mt,
        beside,
        beside_thread,
        cores > 1 && nodes >= PARALLEL_NODES,
    )
}

/// [`context`], on several threads where `parallel`.
fn context_on<'m, R: Send>(
    m: &'m Manifest,
    mt: &'m Tables,
    beside: impl FnOnce() -> R + Send,
    beside_thread: bool,
    parallel: bool,
) -> (Ctx<'m>, Vec<TouchRef>, Vec<Subject<'m>>, R) {
    let counts = touch_counts(m, mt);
    let ((touches_of, bare, recounted), subjects, r) = if parallel {
        std::thread::scope(|scope| {
            let index = scope.spawn(|| TouchIndex::new(m, mt, &counts));
            let (other, r) = if beside_thread {
                (Some(scope.spawn(beside)), None)
            } else {
                (None, Some(beside()))
            };
            let subjects = subjects_of(m, mt, &counts);
            let r = match other {
                Some(other) => joined(other.join()),
                None => r.expect("ran on this thread"),
            };
            (joined(index.join()), subjects, r)
        })
    } else {
        let r = beside();
        (
            TouchIndex::new(m, mt, &counts),
            subjects_of(m, mt, &counts),
            r,
        )
    };
    // Counts the index found wrong (tables not of this manifest) grouped the wrong tensors.
    let subjects = if recounted {
        let counts: Vec<u32> = (0..m.tensors.len()).map(|t| touches_of.count(t)).collect();
        subjects_of(m, mt, &counts)
    } else {
        subjects
    };
    let ctx = Ctx {
        m,
        mt,
        touches_of,
        storages: OnceLock::new(),
        views: OnceLock::new(),
        numbered: false,
    };
    (ctx, bare, subjects, r)
}

/// Whether a manifest and a live snapshot number storages alike: both name one producer
/// session ([`crate::model::format::Producer::session`]).
pub fn one_session(m: &Manifest, l: &Live) -> bool {
    m.producer.session.is_some() && m.producer.session == l.producer.session
}

/// From this many nodes on, a manifest's touch index is filled beside the subjects.
const PARALLEL_NODES: usize = 4096;

/// A scoped thread's result, its panic passed on.
fn joined<T>(r: std::thread::Result<T>) -> T {
    r.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// The touched tensors grouped by view key and storage object (two storages that held
/// one address at different captures are two subjects), in document order of first tensor.
fn subjects_of<'m>(m: &'m Manifest, mt: &Tables, counts: &[u32]) -> Vec<Subject<'m>> {
    let mut by_key: FxHashMap<(ViewKey<'_>, Option<u32>), usize> = FxHashMap::default();
    let mut subjects: Vec<Subject<'_>> = Vec::new();
    for (ti, t) in m.tensors.iter().enumerate() {
        if counts[ti] == 0 {
            continue;
        }
        let si = *by_key.entry((t.view_key(), t.storage)).or_insert_with(|| {
            subjects.push(Subject {
                tensors: SmallVec::new(),
                tensor: t,
                owners: SmallVec::new(),
            });
            subjects.len() - 1
        });
        subjects[si].tensors.push(ti);
        subjects[si].owners.extend_from_slice(&mt.owners_of[ti]);
    }
    subjects
}

/// [`verify`] for documents already checked (the loaders in [`crate::codec::load`] return their
/// [`Tables`]); the tables must be those of these documents. A live snapshot that does not
/// belong with the manifest ([`crate::check::pair::check_pair`]) is an error: verified,
/// it would lose findings.
pub fn verify_checked(
    m: &Manifest,
    mt: &Tables,
    live: Option<(&Live, &Tables)>,
    allow: &Allowlist,
) -> Result<Report, PairError> {
    let index = live.map(|(l, _)| LiveIndex::new(l));
    verify_indexed(
        m,
        mt,
        live.zip(index.as_ref()).map(|((l, lt), i)| (l, lt, i)),
        allow,
    )
}

/// [`verify_checked`] with the live snapshot's [`LiveIndex`] already built (a caller that
/// loads the snapshot on a thread of its own builds it there). The index must be the
/// snapshot's; one whose record counts differ from the snapshot's is built again here.
pub fn verify_indexed(
    m: &Manifest,
    mt: &Tables,
    live: Option<(&Live, &Tables, &LiveIndex)>,
    allow: &Allowlist,
) -> Result<Report, PairError> {
    if let Some((l, lt, index)) = live
        && !index.fits(l)
    {
        return verify_indexed(m, mt, Some((l, lt, &LiveIndex::new(l))), allow);
    }
    // Whether the pair belongs together is checked beside the touch index and the
    // subjects: all three read every touch.
    let (mut ctx, bare, subjects, pair) = context(
        m,
        mt,
        || live.map_or(Ok(()), |(l, _, i)| check_pair_probed(m, l, &i.probed)),
        live.is_some(),
    );
    pair?;
    ctx.numbered = live.is_some_and(|(l, _, _)| one_session(m, l));

    let mut findings = in_parallel(&subjects, |s, out| capture_checks(&ctx, s, out));
    let ownerless = unowned::groups(&ctx, &bare, &subjects);
    unowned::capture_checks(&ctx, &ownerless, &mut findings);
    if let Some((l, lt, index)) = live {
        findings.extend(in_parallel(&subjects, |s, out| {
            live_checks(&ctx, l, lt, &index.addresses, &index.probes, s, out);
        }));
        unowned::live_checks(&ctx, l, lt, &index.probes, &ownerless, &mut findings);
    }
    let gone = live.map_or_else(Vec::new, |(l, _, _)| superseded::superseded(m, l));
    let findings = superseded::leave_out(findings, &gone);

    let checked: Vec<FindingKind> = if let Some((l, _, _)) = live {
        // Without contents to compare, `stale` could not have been found: not checked
        // (the report says so, and an allowlist entry for it is not unused).
        let compared = contents_compared(m, l);
        FindingKind::PAIR
            .iter()
            .copied()
            .filter(|&k| compared || k != FindingKind::Stale)
            .collect()
    } else {
        let mut k = FindingKind::CAPTURE_TIME.to_vec();
        k.push(FindingKind::UnusedAllow);
        k
    };
    let (mut findings, mut allowed) = allow.apply(findings, &checked);
    findings.sort_by(|a, b| (a.kind, &a.subject).cmp(&(b.kind, &b.subject)));
    allowed.sort_by(|a, b| {
        (a.finding.kind, &a.finding.subject).cmp(&(b.finding.kind, &b.finding.subject))
    });
    let mut summary = BTreeMap::new();
    for f in &findings {
        *summary.entry(f.kind).or_insert(0) += 1;
    }
    Ok(Report {
        format_version: REPORT_VERSION,
        ok: findings.iter().all(|f| f.severity == Severity::Warning),
        checked,
        summary,
        findings,
        allowed,
        subjects: subjects.len(),
        graphs: m.graphs.len(),
        unread_nodes: m
            .graphs
            .iter()
            .map(|g| g.unread.len() + g.nodes.iter().filter(|n| n.opaque.is_some()).count())
            .sum(),
        world_size: None,
        ranks: Vec::new(),
        missing_ranks: Vec::new(),
        superseded: gone,
        retarget: Vec::new(),
    })
}

/// Whether the pair has contents to compare, so that `stale` can be found: live digests
/// beside reference digests, or (contents that had to be preserved) digests of tensors or
/// of unowned ranges on both sides.
fn contents_compared(m: &Manifest, l: &Live) -> bool {
    let live_digests = l.tensors.iter().any(|t| t.digest.is_some());
    if live_digests && l.tensors.iter().any(|t| t.reference_digest.is_some()) {
        return true;
    }
    l.event.contents == Contents::Preserved
        && ((live_digests && m.tensors.iter().any(|t| t.digest.is_some()))
            || (!l.ranges.is_empty() && !m.ranges.is_empty()))
}

/// The findings of `check` over every subject, in subject order, the subjects split
/// between the machine's cores (at most [`MAX_THREADS`]): each subject is judged alone.
/// Few subjects are judged on the calling thread.
fn in_parallel<'m, F>(subjects: &[Subject<'m>], check: F) -> Vec<Finding>
where
    F: Fn(&Subject<'m>, &mut Vec<Finding>) + Sync,
{
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_THREADS);
    let run = |chunk: &[Subject<'m>]| {
        let mut out = Vec::new();
        for s in chunk {
            check(s, &mut out);
        }
        out
    };
    if threads < 2 || subjects.len() < PARALLEL_FROM {
        return run(subjects);
    }
    let chunk = subjects.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let jobs: Vec<_> = subjects
            .chunks(chunk)
            .skip(1)
            .map(|c| scope.spawn(move || run(c)))
            .collect();
        let mut out = run(&subjects[..chunk]);
        for job in jobs {
            out.extend(joined(job.join()));
        }
        out
    })
}

/// How many threads judge subjects at most: the checks read shared indexes, and past a few
/// threads the memory they read is the bound.
const MAX_THREADS: usize = 4;

/// Below this many subjects a thread costs more than it saves.
const PARALLEL_FROM: usize = 4096;

fn capture_checks(ctx: &Ctx<'_>, s: &Subject<'_>, out: &mut Vec<Finding>) {
    let p = persistent(ctx, s);
    if p.is_empty() {
        return;
    }
    if !p
        .iter()
        .any(|&o| ctx.m.owners[o].registration.is_registered())
        && ctx.registered_through(s.tensor).is_empty()
    {
        let regs: BTreeSet<&str> = p
            .iter()
            .map(|&o| ctx.m.owners[o].registration.as_str())
            .collect();
        out.push(ctx.finding(
            FindingKind::Unregistered,
            s,
            &p,
            format!(
                "held only as {}; register it as a buffer (or list it in persistent_tensors())",
                regs.into_iter().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    if let Some(pool) = s.tensor.pool {
        let pool = &ctx.m.pools[ctx.mt.pool_ix[&pool] as usize];
        if pool.sleep == SleepPolicy::Discarded {
            out.push(ctx.finding(
                FindingKind::Mispooled,
                s,
                &p,
                format!(
                    "allocated in pool `{}`, whose memory sleep discards without restoring it",
                    pool.name
                ),
            ));
        }
    }
}

/// The tensor ids of a manifest that some touch names.
pub fn touched(m: &Manifest) -> BTreeSet<TensorId> {
    m.graphs
        .iter()
        .flat_map(|g| &g.nodes)
        .flat_map(|n| &n.touches)
        .filter_map(|t| t.tensor)
        .collect()
}

#[cfg(test)]
mod tests;
