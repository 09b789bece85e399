//! Graphs torch will not replay again: a graph of torch.compile's CUDA-graph trees whose
//! guarded static input (`Graph::guards`: an address and the owner paths that held it at
//! capture) is held by one of those paths at another address in the live snapshot. The
//! trees re-record a new graph for the new address (seen on the H200, torch 2.11) instead
//! of replaying the old one, so the old graph's addresses are no hazard: verify leaves the
//! graph out of every finding and names it in the report's `superseded`.

use rustc_hash::FxHashMap;

use super::finding::Finding;
use crate::model::format::{Addr, Guard, Live, Manifest};

/// The names of `m`'s superseded graphs against `l`, in document order. A guard's paths
/// are those the capture learned (a parameter replaced before the manifest was built is no
/// longer among its owners); without any, the manifest's owners of the guarded address.
pub(super) fn superseded(m: &Manifest, l: &Live) -> Vec<String> {
    if m.graphs.iter().all(|g| g.guards.is_empty()) {
        return Vec::new();
    }
    let now: FxHashMap<&str, Addr> = {
        let by_id: FxHashMap<_, Addr> = l.tensors.iter().map(|t| (t.id, t.data_ptr())).collect();
        l.owners
            .iter()
            .filter_map(|o| Some((o.path.as_str(), *by_id.get(&o.tensor)?)))
            .collect()
    };
    // A guard without paths: the manifest's owners of its address.
    let mut at_capture: FxHashMap<Addr, Vec<&str>> = FxHashMap::default();
    if m.graphs
        .iter()
        .flat_map(|g| &g.guards)
        .any(|g| g.paths.is_empty())
    {
        let by_id: FxHashMap<_, Addr> = m.tensors.iter().map(|t| (t.id, t.data_ptr())).collect();
        for o in &m.owners {
            if let Some(&a) = by_id.get(&o.tensor) {
                at_capture.entry(a).or_default().push(o.path.as_str());
            }
        }
    }
    let moved = |guard: &Guard| {
        let differs = |p: &str| now.get(p).is_some_and(|&a| a != guard.addr);
        if guard.paths.is_empty() {
            at_capture
                .get(&guard.addr)
                .is_some_and(|ps| ps.iter().any(|p| differs(p)))
        } else {
            guard.paths.iter().any(|p| differs(p))
        }
    };
    m.graphs
        .iter()
        .filter(|g| g.guards.iter().any(moved))
        .map(|g| g.name.clone())
        .collect()
}

/// `findings` with the `gone` graphs left out: each finding's graphs and kernels lose
/// them, and a finding that named only them is dropped.
pub(super) fn leave_out(findings: Vec<Finding>, gone: &[String]) -> Vec<Finding> {
    if gone.is_empty() {
        return findings;
    }
    let is_gone = |name: &str| gone.iter().any(|g| g == name);
    findings
        .into_iter()
        .filter_map(|mut f| {
            if f.graphs.is_empty() {
                return Some(f);
            }
            f.graphs.retain(|g| !is_gone(g));
            f.kernels.retain(|k| !is_gone(&k.graph));
            (!f.graphs.is_empty()).then_some(f)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::allow::Allowlist;
    use crate::check::finding::FindingKind;
    use crate::check::verify::verify;
    use crate::model::format::Contents;
    use crate::testkit::*;

    /// The testkit's manifest with bs1 guarding `model.w`'s tensor (tensor 0) as a tree
    /// graph would, and a live snapshot where `model.w` was rebound (drifted).
    fn rebound(guard_bs1: bool) -> Report2 {
        rebound_with(guard_bs1, true)
    }

    fn rebound_with(guard_bs1: bool, with_paths: bool) -> Report2 {
        let mut m = manifest();
        let t0 = m.tensors[0].data_ptr();
        let path = m
            .owners
            .iter()
            .find(|o| o.tensor == m.tensors[0].id)
            .unwrap()
            .path
            .clone();
        if guard_bs1 {
            m.graphs[0].guards.push(Guard {
                addr: t0,
                paths: if with_paths {
                    vec![path.to_string()]
                } else {
                    vec![]
                },
            });
        }
        let mut l = live(&m, Contents::Preserved);
        let ti = l.tensors.iter().position(|t| t.data_ptr() == t0).unwrap();
        let mut moved = l.tensors[ti].clone();
        moved.id = crate::model::format::TensorId(900);
        moved.storage_base = Addr(moved.storage_base.0 + 0x10_0000);
        moved.allocation = None;
        l.tensors.push(moved);
        for o in l.owners.iter_mut().filter(|o| o.path == path) {
            o.tensor = crate::model::format::TensorId(900);
        }
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        Report2 {
            drifted: r
                .findings
                .iter()
                .filter(|f| f.kind == FindingKind::Drifted)
                .map(|f| f.graphs.clone())
                .collect(),
            superseded: r.superseded,
        }
    }

    struct Report2 {
        drifted: Vec<Vec<String>>,
        superseded: Vec<String>,
    }

    #[test]
    fn a_guarded_graph_whose_input_moved_is_superseded_and_left_out() {
        let plain = rebound(false);
        assert!(plain.superseded.is_empty());
        assert_eq!(plain.drifted, vec![vec!["bs1".to_string()]]);
        let tree = rebound(true);
        assert_eq!(tree.superseded, vec!["bs1".to_string()]);
        assert!(tree.drifted.is_empty(), "{:?}", tree.drifted);
        // No paths learned: the manifest's owners of the address.
        let tree = rebound_with(true, false);
        assert_eq!(tree.superseded, vec!["bs1".to_string()]);
    }
}
