//! Verifying the ranks of a tensor-parallel run as one: each rank's manifest against its own
//! live snapshot as a single pair is verified, the manifests against each other
//! (`rank_mismatch`), and one allowlist over all of it. The rules are `docs/findings.md`,
//! "Several ranks".

use std::collections::{BTreeMap, BTreeSet};

use crate::check::allow::Allowlist;
use crate::check::finding::{
    Finding, FindingKind, OwnerRef, REPORT_VERSION, RankSummary, Report, Severity,
};
use crate::check::pair::PairError;
use crate::check::verify::verify_checked;
use crate::index::refs::Tables;
use crate::model::format::{Live, Manifest, Registration};

/// One rank's documents, checked.
#[derive(Clone, Copy)]
pub struct RankDocs<'a> {
    pub rank: u32,
    pub manifest: &'a Manifest,
    pub tables: &'a Tables,
    pub live: Option<(&'a Live, &'a Tables)>,
}

/// A rank whose live snapshot does not belong with its manifest (see [`PairError`]).
#[derive(Debug, thiserror::Error)]
#[error("rank {rank}: {source}")]
pub struct RankPairError {
    pub rank: u32,
    #[source]
    pub source: PairError,
}

/// Verifies every rank as `verify MANIFEST [LIVE]` does, adds the cross-rank findings of
/// [`rank_mismatches`], and applies `allow` once to all of them: an entry is unused only
/// if it allowed nothing on any rank. Findings carry their rank (cross-rank ones none) and
/// are sorted by kind, subject, then rank. `missing` (ranks below `world_size` with no
/// manifest) is reported as a warning.
pub fn verify_ranks(
    world_size: u32,
    ranks: &[RankDocs<'_>],
    missing: Vec<u32>,
    allow: &Allowlist,
) -> Result<Report, RankPairError> {
    let mut findings = Vec::new();
    let mut checked: BTreeSet<FindingKind> = BTreeSet::from([FindingKind::RankMismatch]);
    let mut parts = Vec::new();
    let mut superseded = Vec::new();
    for d in ranks {
        // Allowlist entries apply below, across ranks: here every finding is kept.
        let r = verify_checked(d.manifest, d.tables, d.live, &Allowlist::default()).map_err(
            |source| RankPairError {
                rank: d.rank,
                source,
            },
        )?;
        checked.extend(&r.checked);
        superseded.extend(
            r.superseded
                .iter()
                .map(|g| format!("{g} (rank {})", d.rank)),
        );
        findings.extend(r.findings.into_iter().map(|mut f| {
            f.rank = Some(d.rank);
            f
        }));
        parts.push((
            d.rank,
            d.live.is_some(),
            r.subjects,
            r.graphs,
            r.unread_nodes,
        ));
    }
    let manifests: Vec<(u32, &Manifest, &Tables)> = ranks
        .iter()
        .map(|d| (d.rank, d.manifest, d.tables))
        .collect();
    findings.extend(rank_mismatches(&manifests));

    let checked: Vec<FindingKind> = checked.into_iter().collect();
    let (mut findings, mut allowed) = allow.apply(findings, &checked);
    findings.sort_by(|a, b| (a.kind, &a.subject, a.rank).cmp(&(b.kind, &b.subject, b.rank)));
    allowed.sort_by(|a, b| {
        let key = |f: &Finding| (f.kind, f.subject.clone(), f.rank);
        key(&a.finding).cmp(&key(&b.finding))
    });
    let mut summary = BTreeMap::new();
    for f in &findings {
        *summary.entry(f.kind).or_insert(0) += 1;
    }
    let ranks: Vec<RankSummary> = parts
        .into_iter()
        .map(|(rank, live, subjects, graphs, unread_nodes)| {
            let mine = || findings.iter().filter(move |f| f.rank == Some(rank));
            let mut summary = BTreeMap::new();
            for f in mine() {
                *summary.entry(f.kind).or_insert(0) += 1;
            }
            RankSummary {
                rank,
                ok: mine().all(|f| f.severity == Severity::Warning),
                live,
                summary,
                subjects,
                graphs,
                unread_nodes,
            }
        })
        .collect();
    Ok(Report {
        format_version: REPORT_VERSION,
        ok: findings.iter().all(|f| f.severity == Severity::Warning),
        checked,
        summary,
        subjects: ranks.iter().map(|r| r.subjects).sum(),
        graphs: ranks.iter().map(|r| r.graphs).sum(),
        unread_nodes: ranks.iter().map(|r| r.unread_nodes).sum(),
        findings,
        allowed,
        world_size: Some(world_size),
        ranks,
        missing_ranks: missing,
        superseded,
        retarget: Vec::new(),
    })
}

/// What one rank records for an owner path: its registration, dtype and shape.
type Seen<'m> = (Registration, &'m str, &'m [u64]);

/// The owner paths the manifests disagree on: a path some ranks record and others do not,
/// or whose tensor has another shape or dtype on some rank. Every owner path counts,
/// whatever its registration (runtime state and graph inputs too): tensor parallelism
/// shards a layer the same way on every rank, so a difference is a rank that loaded
/// another model, another shard layout or another configuration. One finding per path, in
/// path order; with fewer than two ranks there is nothing to compare.
pub fn rank_mismatches(ranks: &[(u32, &Manifest, &Tables)]) -> Vec<Finding> {
    if ranks.len() < 2 {
        return Vec::new();
    }
    let mut paths: BTreeMap<String, BTreeMap<u32, Seen<'_>>> = BTreeMap::new();
    for &(rank, m, t) in ranks {
        for o in &m.owners {
            let tensor = t.tensor(&m.tensors, o.tensor);
            paths
                .entry(o.path.to_string())
                .or_default()
                .entry(rank)
                .or_insert((
                    o.registration,
                    tensor.dtype.as_str(),
                    tensor.shape.as_slice(),
                ));
        }
    }
    let all: Vec<u32> = ranks.iter().map(|&(r, _, _)| r).collect();
    let mut out = Vec::new();
    for (path, seen) in paths {
        let Some(detail) = mismatch(&all, &seen) else {
            continue;
        };
        let registration = seen.values().next().expect("a path some rank records").0;
        out.push(Finding {
            owners: vec![OwnerRef {
                path: path.clone(),
                registration,
            }],
            ..Finding::about(FindingKind::RankMismatch, Severity::Error, path, detail)
        });
    }
    out
}

/// A tensor as ranks are compared by it: dtype and shape.
type Held<'m> = (&'m str, &'m [u64]);

/// The sentence for a path the ranks disagree on, or `None` where they agree: each
/// distinct tensor with the ranks that hold it, then the ranks without the path. Only what
/// differs is named: `shape [4096, 512] on ranks 0, 1; [4096, 256] on rank 2`.
fn mismatch(all: &[u32], seen: &BTreeMap<u32, Seen<'_>>) -> Option<String> {
    let absent: Vec<u32> = all
        .iter()
        .copied()
        .filter(|r| !seen.contains_key(r))
        .collect();
    let mut variants: Vec<(Held<'_>, Vec<u32>)> = Vec::new();
    for (&rank, &(_, dtype, shape)) in seen {
        match variants.iter_mut().find(|(v, _)| *v == (dtype, shape)) {
            Some((_, ranks)) => ranks.push(rank),
            None => variants.push(((dtype, shape), vec![rank])),
        }
    }
    if absent.is_empty() && variants.len() == 1 {
        return None;
    }
    let dtypes: BTreeSet<&str> = variants.iter().map(|((d, _), _)| *d).collect();
    let shapes: BTreeSet<&[u64]> = variants.iter().map(|((_, s), _)| *s).collect();
    let dims = |s: &[u64]| {
        let d: Vec<String> = s.iter().map(u64::to_string).collect();
        format!("[{}]", d.join(", "))
    };
    let mut parts: Vec<String> = variants
        .iter()
        .enumerate()
        .map(|(i, ((dtype, shape), ranks))| {
            let what = match (dtypes.len() > 1, shapes.len() > 1) {
                (true, true) => format!("{dtype}{}", dims(shape)),
                (true, false) => format!("{}{dtype}", if i == 0 { "dtype " } else { "" }),
                (false, true) => format!("{}{}", if i == 0 { "shape " } else { "" }, dims(shape)),
                (false, false) => "present".to_string(),
            };
            format!("{what} on {}", rank_list(ranks))
        })
        .collect();
    if !absent.is_empty() {
        parts.push(format!("absent on {}", rank_list(&absent)));
    }
    Some(parts.join("; "))
}

/// `rank 2`, `ranks 0, 1`.
pub fn rank_list(ranks: &[u32]) -> String {
    let list: Vec<String> = ranks.iter().map(u32::to_string).collect();
    format!(
        "{} {}",
        if ranks.len() == 1 { "rank" } else { "ranks" },
        list.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::refs::{check_live, check_manifest};
    use crate::model::format::Contents;
    use crate::testkit::{live, manifest};

    fn on_rank(rank: u32, world_size: u32, mut m: Manifest) -> Manifest {
        m.producer.rank = rank;
        m.producer.world_size = world_size;
        m
    }

    fn mismatches(ms: &[Manifest]) -> Vec<(String, String)> {
        let ts: Vec<Tables> = ms.iter().map(|m| check_manifest(m).unwrap()).collect();
        let ranks: Vec<(u32, &Manifest, &Tables)> = ms
            .iter()
            .zip(&ts)
            .map(|(m, t)| (m.producer.rank, m, t))
            .collect();
        rank_mismatches(&ranks)
            .into_iter()
            .map(|f| (f.subject, f.detail))
            .collect()
    }

    #[test]
    fn equal_ranks_give_no_mismatch() {
        let ms: Vec<Manifest> = (0..3).map(|r| on_rank(r, 3, manifest())).collect();
        assert_eq!(mismatches(&ms), vec![]);
        // One rank alone has nothing to be compared with.
        assert_eq!(mismatches(&ms[..1]), vec![]);
    }

    #[test]
    fn a_shape_dtype_or_path_that_differs_names_the_ranks_and_only_what_differs() {
        // Guards: the detail groups ranks by what they hold and names only the field that
        // differs; an absent path is named with the ranks that lack it.
        let mut ms: Vec<Manifest> = (0..3).map(|r| on_rank(r, 3, manifest())).collect();
        ms[2].tensors[0].shape = vec![64];
        ms[2].tensors[0].nbytes = 128;
        ms[1].tensors[2].dtype = "float16".into();
        ms[0].owners.retain(|o| o.path != "model.scale_alias");
        assert_eq!(
            mismatches(&ms),
            vec![
                (
                    "model.meta".into(),
                    "dtype bfloat16 on ranks 0, 2; float16 on rank 1".into()
                ),
                (
                    "model.scale_alias".into(),
                    "present on ranks 1, 2; absent on rank 0".into()
                ),
                (
                    "model.w".into(),
                    "shape [128] on ranks 0, 1; [64] on rank 2".into()
                ),
            ]
        );
        ms[2].tensors[0].dtype = "float32".into();
        ms[2].tensors[0].itemsize = 4;
        ms[2].tensors[0].nbytes = 256;
        assert_eq!(
            mismatches(&ms)[2].1,
            "bfloat16[128] on ranks 0, 1; float32[64] on rank 2"
        );
    }

    #[test]
    fn findings_carry_their_rank_and_one_allowlist_covers_every_rank() {
        // Guards: a finding of rank 1 says rank 1; an allow entry used on one rank only is
        // not reported unused; a rank_mismatch is allowed by its path.
        let m0 = on_rank(0, 2, manifest());
        let mut m1 = on_rank(1, 2, manifest());
        m1.tensors[0].shape = vec![64];
        m1.tensors[0].nbytes = 128;
        let (t0, t1) = (check_manifest(&m0).unwrap(), check_manifest(&m1).unwrap());
        let mut l0 = live(&m0, Contents::Preserved);
        l0.producer = m0.producer.clone();
        let mut l1 = live(&m1, Contents::Preserved);
        l1.producer = m1.producer.clone();
        l1.owners.retain(|o| o.path != "model.meta");
        let (lt0, lt1) = (check_live(&l0).unwrap(), check_live(&l1).unwrap());
        let docs = [
            RankDocs {
                rank: 0,
                manifest: &m0,
                tables: &t0,
                live: Some((&l0, &lt0)),
            },
            RankDocs {
                rank: 1,
                manifest: &m1,
                tables: &t1,
                live: Some((&l1, &lt1)),
            },
        ];
        let r = verify_ranks(2, &docs, vec![], &Allowlist::default()).unwrap();
        let got: Vec<(FindingKind, &str, Option<u32>)> = r
            .findings
            .iter()
            .map(|f| (f.kind, f.subject.as_str(), f.rank))
            .collect();
        assert!(
            got.contains(&(FindingKind::Vanished, "model.meta", Some(1))),
            "{got:?}"
        );
        assert!(
            !got.contains(&(FindingKind::Vanished, "model.meta", Some(0))),
            "{got:?}"
        );
        assert!(
            got.contains(&(FindingKind::RankMismatch, "model.w", None)),
            "{got:?}"
        );
        assert!(!r.ok);
        assert!(r.ranks.iter().all(|s| !s.live || s.rank < 2));
        assert_eq!(r.ranks[1].summary.get(&FindingKind::Vanished), Some(&1));
        assert_eq!(r.ranks[0].summary.get(&FindingKind::Vanished), None);
        assert_eq!(r.world_size, Some(2));
        assert!(r.checked.contains(&FindingKind::RankMismatch));

        let allow = Allowlist::parse(
            "[[allow]]\npath = \"model.meta\"\nkinds = [\"vanished\"]\nreason = \"r\"\n\
             [[allow]]\npath = \"model.w\"\nkinds = [\"rank_mismatch\"]\nreason = \"uneven shard\"\n",
        )
        .unwrap();
        let r = verify_ranks(2, &docs, vec![], &allow).unwrap();
        let left: Vec<_> = r
            .findings
            .iter()
            .map(|f| (f.kind, f.subject.as_str()))
            .collect();
        assert!(
            !left.iter().any(|(k, _)| matches!(
                k,
                FindingKind::UnusedAllow | FindingKind::RankMismatch | FindingKind::Vanished
            )),
            "{left:?}"
        );
        assert_eq!(r.allowed.len(), 2);
    }

    #[test]
    fn a_live_snapshot_of_another_rank_is_still_refused() {
        // Guards: the pair check stays in force per rank.
        let m0 = on_rank(0, 2, manifest());
        let t0 = check_manifest(&m0).unwrap();
        let mut l = live(&m0, Contents::Preserved);
        l.producer.rank = 1;
        l.producer.world_size = 2;
        let lt = check_live(&l).unwrap();
        let docs = [RankDocs {
            rank: 0,
            manifest: &m0,
            tables: &t0,
            live: Some((&l, &lt)),
        }];
        let e = verify_ranks(2, &docs, vec![1], &Allowlist::default()).unwrap_err();
        assert_eq!(e.rank, 0);
        assert!(matches!(e.source, PairError::Rank { .. }));
    }
}
