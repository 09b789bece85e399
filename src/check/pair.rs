//! Whether a live snapshot belongs with a manifest: each may be valid alone, and the pair
//! still not comparable (another rank's snapshot, or one taken against another manifest).

use std::collections::BTreeSet;

use rustc_hash::FxHashSet;

use std::path::Path;

use crate::codec::load::LoadError;
use crate::model::format::{Addr, Live, Manifest};

/// Why a live snapshot cannot be verified against a manifest although each is valid: it
/// was not taken of the process, or against the manifest, that the manifest records.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PairError {
    #[error(
        "the manifest was recorded on rank {} of {}, the live snapshot on rank {} of {} \
         (verify each rank's live snapshot against that rank's manifest)",
        manifest.0, manifest.1, live.0, live.1
    )]
    Rank {
        /// (rank, world size) of the manifest's producer.
        manifest: (u32, u32),
        /// (rank, world size) of the live snapshot's producer.
        live: (u32, u32),
    },
    #[error(
        "the live snapshot has no probe for {addr}, which {} {}{}{}; a live snapshot probes \
         every address the manifest captured (was it taken against another manifest?)",
        if graphs.len() == 1 { "graph" } else { "graphs" },
        graphs.iter().map(|g| format!("`{g}`")).collect::<Vec<_>>().join(", "),
        if graphs.len() == 1 { " holds" } else { " hold" },
        match more { 0 => String::new(), 1 => " (and so does 1 other captured address)".into(), n => format!(" (and so do {n} other captured addresses)") },
    )]
    MissingProbe {
        addr: Addr,
        /// The names of the graphs whose nodes hold `addr`, sorted.
        graphs: Vec<String>,
        /// How many other captured addresses have no probe either.
        more: usize,
    },
}

/// Checks that a live snapshot belongs with a manifest: the same rank of the same world
/// size, and a probe for every address the manifest's graphs hold (what `build_live`
/// writes). Without its probe, a captured address could not be found `freed`: the pair is
/// refused rather than verified with findings missing.
pub fn check_pair(m: &Manifest, l: &Live) -> Result<(), PairError> {
    check_pair_probed(m, l, &probed(l))
}

/// The addresses `l` probes, for [`check_pair_probed`]. A hash set: a million touches
/// against 200,000 probes took 100 ms and more as binary searches (a cache miss at every
/// step), a few tens as hash lookups.
pub fn probed(l: &Live) -> FxHashSet<Addr> {
    l.probes.iter().map(|p| p.addr).collect()
}

/// [`check_pair`] with the live snapshot's [`probed`] addresses already collected (a
/// caller that loads the snapshot on a thread of its own collects them there).
pub fn check_pair_probed(
    m: &Manifest,
    l: &Live,
    probed: &FxHashSet<Addr>,
) -> Result<(), PairError> {
    let (mp, lp) = (&m.producer, &l.producer);
    if (mp.rank, mp.world_size) != (lp.rank, lp.world_size) {
        return Err(PairError::Rank {
            manifest: (mp.rank, mp.world_size),
            live: (lp.rank, lp.world_size),
        });
    }
    let touches = || {
        m.graphs.iter().flat_map(|g| {
            g.nodes
                .iter()
                .flat_map(move |n| n.touches.iter().map(move |t| (g, t.addr)))
        })
    };
    let mut missing = touches().map(|(_, a)| a).filter(|a| !probed.contains(a));
    let Some(addr) = missing.next() else {
        return Ok(());
    };
    let mut others: Vec<Addr> = missing.filter(|&a| a != addr).collect();
    others.sort_unstable();
    others.dedup();
    let graphs: BTreeSet<&str> = touches()
        .filter(|&(_, a)| a == addr)
        .map(|(g, _)| g.name.as_str())
        .collect();
    Err(PairError::MissingProbe {
        addr,
        graphs: graphs.into_iter().map(String::from).collect(),
        more: others.len(),
    })
}

impl PairError {
    /// The error naming both files.
    pub fn in_files(self, manifest: &Path, live: &Path) -> LoadError {
        LoadError::Pair {
            manifest: manifest.to_path_buf(),
            live: live.to_path_buf(),
            why: Box::new(self),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::format::Contents;
    use crate::testkit::{BASE, live, manifest};

    /// Regression: a snapshot of rank 3 of 8 was verified against a manifest of rank 0 of 1.
    #[test]
    fn another_rank_or_world_size_is_refused_naming_both() {
        let m = manifest();
        let mut l = live(&m, Contents::Preserved);
        assert_eq!(check_pair(&m, &l), Ok(()));
        l.producer.rank = 3;
        l.producer.world_size = 8;
        let e = check_pair(&m, &l).unwrap_err();
        assert_eq!(
            e,
            PairError::Rank {
                manifest: (0, 1),
                live: (3, 8)
            }
        );
        assert!(
            e.to_string().starts_with(
                "the manifest was recorded on rank 0 of 1, the live snapshot on rank 3 of 8"
            ),
            "{e}"
        );
        l.producer.rank = 0;
        assert!(matches!(check_pair(&m, &l), Err(PairError::Rank { .. })));
    }

    /// Regression: a captured address without a probe silently lost its `freed` finding.
    #[test]
    fn a_captured_address_without_a_probe_is_refused_naming_it_and_its_graphs() {
        let m = manifest();
        let mut l = live(&m, Contents::Preserved);
        let meta = Addr(BASE + 2 * 0x1000);
        l.probes.retain(|p| p.addr != meta);
        let e = check_pair(&m, &l).unwrap_err();
        assert_eq!(
            e,
            PairError::MissingProbe {
                addr: meta,
                graphs: vec!["bs1".into()],
                more: 0
            }
        );
        assert!(
            e.to_string().starts_with(&format!(
                "the live snapshot has no probe for {meta}, which graph `bs1` holds; "
            )),
            "{e}"
        );
        // The first missing address in document order is named, the others counted.
        l.probes.clear();
        let e = check_pair(&m, &l).unwrap_err();
        assert_eq!(
            e,
            PairError::MissingProbe {
                addr: Addr(BASE),
                graphs: vec!["bs1".into()],
                more: 4
            }
        );
        assert!(
            e.to_string()
                .contains("(and so do 4 other captured addresses)"),
            "{e}"
        );
    }
}
