//! Which documents of a tensor-parallel run go together: the manifests and live snapshots
//! of one run (`verify DIR`), grouped by the rank their producer records, so that a live
//! snapshot is only ever compared with its own rank's manifest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::model::format::DocKind;

/// What grouping needs to know of one document.
#[derive(Clone, Copy, Debug)]
pub struct RankDoc<'a> {
    pub path: &'a Path,
    pub kind: DocKind,
    /// `producer.rank`.
    pub rank: u32,
    /// `producer.world_size`.
    pub world_size: u32,
}

/// One rank's documents, as indices into the slice given to [`group`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankFiles {
    pub rank: u32,
    pub manifest: usize,
    pub live: Option<usize>,
}

/// The documents of a run, by rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ranks {
    /// The one world size every document records.
    pub world_size: u32,
    /// Every rank that has a manifest, in rank order.
    pub ranks: Vec<RankFiles>,
    /// Ranks below the world size with no document: a warning for the report, not an error.
    pub missing: Vec<u32>,
}

/// Why the documents of a folder do not make one run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RanksError {
    #[error("no manifest or live snapshot (`*.json`) to verify")]
    Empty,
    #[error(
        "the documents record different world sizes: {} (one run's documents share one)",
        sizes.iter().map(|(w, p)| format!("{w} in {}", p.display())).collect::<Vec<_>>().join(", ")
    )]
    WorldSizes {
        /// Each world size and the first file (in name order) that records it.
        sizes: Vec<(u32, PathBuf)>,
    },
    #[error("{}: rank {rank} is not below the world size {world_size}", path.display())]
    RankOutOfRange {
        path: PathBuf,
        rank: u32,
        world_size: u32,
    },
    #[error(
        "rank {rank} has two manifests, {} and {} (one manifest per rank)",
        first.display(), second.display()
    )]
    TwoManifests {
        rank: u32,
        first: PathBuf,
        second: PathBuf,
    },
    #[error(
        "rank {rank} has two live snapshots, {} and {} (at most one per rank)",
        first.display(), second.display()
    )]
    TwoLives {
        rank: u32,
        first: PathBuf,
        second: PathBuf,
    },
    #[error(
        "{} is a live snapshot of rank {rank}, which has no manifest to verify it against",
        live.display()
    )]
    LiveWithoutManifest { rank: u32, live: PathBuf },
}

/// Groups documents by rank: exactly one manifest and at most one live snapshot per rank,
/// one world size across all, every rank below it. Ranks with no document are listed in
/// [`Ranks::missing`]. Errors name the first offending files in the order given (callers
/// give them sorted by name, so the message does not depend on the folder's order).
pub fn group(docs: &[RankDoc<'_>]) -> Result<Ranks, RanksError> {
    let first = docs.first().ok_or(RanksError::Empty)?;
    let mut sizes: Vec<(u32, PathBuf)> = Vec::new();
    for d in docs {
        if !sizes.iter().any(|(w, _)| *w == d.world_size) {
            sizes.push((d.world_size, d.path.to_path_buf()));
        }
    }
    if sizes.len() > 1 {
        return Err(RanksError::WorldSizes { sizes });
    }
    let world_size = first.world_size;
    let mut manifests: BTreeMap<u32, usize> = BTreeMap::new();
    let mut lives: BTreeMap<u32, usize> = BTreeMap::new();
    for (i, d) in docs.iter().enumerate() {
        if d.rank >= world_size {
            return Err(RanksError::RankOutOfRange {
                path: d.path.to_path_buf(),
                rank: d.rank,
                world_size,
            });
        }
        let seen = match d.kind {
            DocKind::Manifest => &mut manifests,
            DocKind::Live => &mut lives,
        };
        if let Some(&j) = seen.get(&d.rank) {
            let (rank, first, second) = (d.rank, docs[j].path.to_path_buf(), d.path.to_path_buf());
            return Err(match d.kind {
                DocKind::Manifest => RanksError::TwoManifests {
                    rank,
                    first,
                    second,
                },
                DocKind::Live => RanksError::TwoLives {
                    rank,
                    first,
                    second,
                },
            });
        }
        seen.insert(d.rank, i);
    }
    if let Some((&rank, &l)) = lives.iter().find(|(r, _)| !manifests.contains_key(r)) {
        return Err(RanksError::LiveWithoutManifest {
            rank,
            live: docs[l].path.to_path_buf(),
        });
    }
    Ok(Ranks {
        world_size,
        ranks: manifests
            .iter()
            .map(|(&rank, &manifest)| RankFiles {
                rank,
                manifest,
                live: lives.get(&rank).copied(),
            })
            .collect(),
        missing: (0..world_size)
            .filter(|r| !manifests.contains_key(r))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(path: &'static str, kind: DocKind, rank: u32, world_size: u32) -> RankDoc<'static> {
        RankDoc {
            path: Path::new(path),
            kind,
            rank,
            world_size,
        }
    }

    use DocKind::{Live as L, Manifest as M};

    #[test]
    fn a_full_run_groups_each_live_with_its_own_ranks_manifest() {
        // Guards: the live snapshot of rank 1 must be paired with rank 1's manifest even
        // where the files sort in another order.
        let docs = [
            doc("a-live-1.json", L, 1, 2),
            doc("b-manifest-0.json", M, 0, 2),
            doc("c-manifest-1.json", M, 1, 2),
            doc("d-live-0.json", L, 0, 2),
        ];
        let g = group(&docs).unwrap();
        assert_eq!(g.world_size, 2);
        assert_eq!(
            g.ranks,
            vec![
                RankFiles {
                    rank: 0,
                    manifest: 1,
                    live: Some(3)
                },
                RankFiles {
                    rank: 1,
                    manifest: 2,
                    live: Some(0)
                },
            ]
        );
        assert!(g.missing.is_empty());
    }

    #[test]
    fn missing_ranks_are_listed_not_refused() {
        // Guards: a run of TP=4 with ranks 0 and 2 only still verifies, naming 1 and 3.
        let docs = [doc("m0.json", M, 0, 4), doc("m2.json", M, 2, 4)];
        let g = group(&docs).unwrap();
        assert_eq!(g.missing, vec![1, 3]);
        assert_eq!(g.ranks.len(), 2);
        assert_eq!(g.ranks[1].live, None);
    }

    #[test]
    fn two_manifests_of_one_rank_are_refused_naming_both() {
        let docs = [
            doc("m0.json", M, 0, 2),
            doc("m1.json", M, 1, 2),
            doc("m1-again.json", M, 1, 2),
        ];
        let e = group(&docs).unwrap_err();
        assert_eq!(
            e.to_string(),
            "rank 1 has two manifests, m1.json and m1-again.json (one manifest per rank)"
        );
    }

    #[test]
    fn two_live_snapshots_of_one_rank_are_refused_naming_both() {
        let docs = [
            doc("l0.json", L, 0, 1),
            doc("l0b.json", L, 0, 1),
            doc("m0.json", M, 0, 1),
        ];
        assert_eq!(
            group(&docs).unwrap_err(),
            RanksError::TwoLives {
                rank: 0,
                first: "l0.json".into(),
                second: "l0b.json".into()
            }
        );
    }

    #[test]
    fn a_live_snapshot_without_its_ranks_manifest_is_refused() {
        // Guards: rank 1's snapshot must not be verified against rank 0's manifest.
        let docs = [doc("l1.json", L, 1, 2), doc("m0.json", M, 0, 2)];
        let e = group(&docs).unwrap_err();
        assert_eq!(
            e,
            RanksError::LiveWithoutManifest {
                rank: 1,
                live: "l1.json".into()
            }
        );
        assert!(
            e.to_string()
                .starts_with("l1.json is a live snapshot of rank 1")
        );
    }

    #[test]
    fn mixed_world_sizes_are_refused_naming_a_file_of_each() {
        let docs = [
            doc("a.json", M, 0, 2),
            doc("b.json", M, 1, 2),
            doc("c.json", M, 1, 4),
        ];
        let e = group(&docs).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the documents record different world sizes: 2 in a.json, 4 in c.json \
             (one run's documents share one)"
        );
    }

    #[test]
    fn a_rank_at_or_above_the_world_size_and_an_empty_folder_are_refused() {
        let docs = [doc("m.json", M, 2, 2)];
        assert_eq!(
            group(&docs).unwrap_err().to_string(),
            "m.json: rank 2 is not below the world size 2"
        );
        assert_eq!(group(&[]).unwrap_err(), RanksError::Empty);
    }
}
