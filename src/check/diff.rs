//! Diff two documents (manifests or live snapshots) by owner path: which paths exist in
//! one alone, and where registration, layout (every field of the view but its addresses:
//! shape, stride, dtype, itemsize, offset, byte span, storage size, device) or contents
//! differ; and, by name, pools whose kind or sleep policy differ. Addresses are not
//! compared: the two usually come from different processes (a fresh load against a reload
//! of the same weights, where every tensor must match).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::model::format::{Document, Pool, Tensor};

/// What differs at one owner path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Change {
    /// In A alone.
    Removed,
    /// In B alone.
    Added,
    Registration,
    Layout,
    Digest,
    Pool,
    /// A pool's kind (`weights`, `kv_cache`, …).
    Kind,
    /// A pool's sleep policy (`untouched`, `restored`, `discarded`).
    Sleep,
    /// A graph of both manifests reads, through its captured tensors, owner paths that
    /// the other's does not: it captured other tensors (a storage that died between two
    /// captures and whose block another owner's tensor took, told apart in one manifest
    /// and merged in the other).
    Reads,
}

/// One difference.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Difference {
    pub path: String,
    pub change: Change,
    /// A's side, in words.
    pub a: Option<String>,
    /// B's side, in words.
    pub b: Option<String>,
}

/// All differences, path order.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DiffReport {
    pub format_version: u32,
    pub same: bool,
    pub compared: usize,
    pub differences: Vec<Difference>,
    /// Graphs (by name) in one manifest alone, or with other node counts.
    pub graphs: Vec<Difference>,
    /// Pools (by name) in both documents whose kind or sleep policy differ: what sleep
    /// does to every tensor in them changed. (Pools in one document alone are not listed:
    /// a graph pool's name carries the process's pool id; a tensor that changed pools is
    /// a `pool` difference at its owner path.)
    pub pools: Vec<Difference>,
}

fn pool_name(d: &Document, t: &Tensor) -> Option<String> {
    let p = t.pool?;
    d.pools().iter().find(|x| x.id == p).map(|x| x.name.clone())
}

/// `t`'s layout with its offset, and whatever else differs from `other`'s: its element
/// size, byte span, storage size or device (`bfloat16[4] stride [1] offset 0 on cuda:1`).
fn layout_against(t: &Tensor, other: &Tensor) -> String {
    let mut s = format!("{} offset {}", t.layout(), t.offset);
    if t.itemsize != other.itemsize {
        s += &format!(" itemsize {}", t.itemsize);
    }
    if t.nbytes != other.nbytes {
        s += &format!(" nbytes {}", t.nbytes);
    }
    if t.storage_nbytes != other.storage_nbytes {
        s += &format!(" in a storage of {} bytes", t.storage_nbytes);
    }
    if t.device != other.device {
        s += &format!(" on {}", t.device);
    }
    s
}

/// Compares A and B by owner path.
pub fn diff(a: &Document, b: &Document) -> DiffReport {
    let index = |d: &Document| -> BTreeMap<String, (crate::model::format::Registration, usize)> {
        let ix: HashMap<_, usize> = d
            .tensors()
            .iter()
            .enumerate()
            .map(|(i, t)| (t.id, i))
            .collect();
        // A manifest's path given once per storage it held compares by its first record:
        // what it held at the producer's last walk.
        let mut paths = BTreeMap::new();
        for o in d.owners() {
            if let Some(&t) = ix.get(&o.tensor) {
                paths
                    .entry(o.path.to_string())
                    .or_insert((o.registration, t));
            }
        }
        paths
    };
    let (ia, ib) = (index(a), index(b));
    let mut differences = Vec::new();
    let mut compared = 0;
    for (path, &(ra, ta)) in &ia {
        let tensor_a = &a.tensors()[ta];
        let Some(&(rb, tb)) = ib.get(path) else {
            differences.push(Difference {
                path: path.clone(),
                change: Change::Removed,
                a: Some(format!("{} ({ra})", tensor_a.layout())),
                b: None,
            });
            continue;
        };
        compared += 1;
        let tensor_b = &b.tensors()[tb];
        if ra != rb {
            differences.push(Difference {
                path: path.clone(),
                change: Change::Registration,
                a: Some(ra.to_string()),
                b: Some(rb.to_string()),
            });
        }
        if !tensor_a.same_layout(tensor_b) || tensor_a.storage_nbytes != tensor_b.storage_nbytes {
            differences.push(Difference {
                path: path.clone(),
                change: Change::Layout,
                a: Some(layout_against(tensor_a, tensor_b)),
                b: Some(layout_against(tensor_b, tensor_a)),
            });
        }
        if let (Some(da), Some(db)) = (&tensor_a.digest, &tensor_b.digest)
            && da.algorithm() == db.algorithm()
            && da != db
        {
            differences.push(Difference {
                path: path.clone(),
                change: Change::Digest,
                a: Some(da.0.clone()),
                b: Some(db.0.clone()),
            });
        }
        let (pa, pb) = (pool_name(a, tensor_a), pool_name(b, tensor_b));
        if pa.is_some() && pb.is_some() && pa != pb {
            differences.push(Difference {
                path: path.clone(),
                change: Change::Pool,
                a: pa,
                b: pb,
            });
        }
    }
    for (path, &(rb, tb)) in &ib {
        if !ia.contains_key(path) {
            differences.push(Difference {
                path: path.clone(),
                change: Change::Added,
                a: None,
                b: Some(format!("{} ({rb})", b.tensors()[tb].layout())),
            });
        }
    }
    differences.sort_by(|x, y| (&x.path, &x.change).cmp(&(&y.path, &y.change)));

    let mut graphs = Vec::new();
    if let (Document::Manifest(ma), Document::Manifest(mb)) = (a, b) {
        let ga: BTreeMap<&str, u64> = ma
            .graphs
            .iter()
            .map(|g| (g.name.as_str(), g.node_counts.values().sum()))
            .collect();
        let gb: BTreeMap<&str, u64> = mb
            .graphs
            .iter()
            .map(|g| (g.name.as_str(), g.node_counts.values().sum()))
            .collect();
        for (name, na) in &ga {
            match gb.get(name) {
                None => graphs.push(Difference {
                    path: name.to_string(),
                    change: Change::Removed,
                    a: Some(format!("{na} nodes")),
                    b: None,
                }),
                Some(nb) if nb != na => graphs.push(Difference {
                    path: name.to_string(),
                    change: Change::Layout,
                    a: Some(format!("{na} nodes")),
                    b: Some(format!("{nb} nodes")),
                }),
                _ => {}
            }
        }
        for (name, nb) in &gb {
            if !ga.contains_key(name) {
                graphs.push(Difference {
                    path: name.to_string(),
                    change: Change::Added,
                    a: None,
                    b: Some(format!("{nb} nodes")),
                });
            }
        }
        graphs.extend(read_changes(ma, mb));
    }
    let pools = pool_changes(a, b);
    DiffReport {
        format_version: 1,
        same: differences.is_empty() && graphs.is_empty() && pools.is_empty(),
        compared,
        differences,
        graphs,
        pools,
    }
}

/// The owner paths each graph reads through the tensors its touches name, by graph name.
fn reads(m: &crate::model::format::Manifest) -> BTreeMap<&str, std::collections::BTreeSet<&str>> {
    let mut owners: HashMap<crate::model::format::TensorId, Vec<&str>> = HashMap::new();
    for o in &m.owners {
        owners.entry(o.tensor).or_default().push(o.path.as_str());
    }
    m.graphs
        .iter()
        .map(|g| {
            let paths = g
                .nodes
                .iter()
                .flat_map(|n| &n.touches)
                .filter_map(|t| t.tensor)
                .flat_map(|t| owners.get(&t).into_iter().flatten().copied())
                .collect();
            (g.name.as_str(), paths)
        })
        .collect()
}

/// Graphs of both manifests whose captured tensors are owned by other paths: A's side
/// lists the paths only A's graph reads, B's those only B's reads.
fn read_changes(
    a: &crate::model::format::Manifest,
    b: &crate::model::format::Manifest,
) -> Vec<Difference> {
    let (ra, rb) = (reads(a), reads(b));
    let mut out = Vec::new();
    for (name, pa) in &ra {
        let Some(pb) = rb.get(name) else { continue };
        if pa == pb {
            continue;
        }
        let only = |x: &std::collections::BTreeSet<&str>, y: &std::collections::BTreeSet<&str>| {
            let v: Vec<&str> = x.difference(y).copied().collect();
            (!v.is_empty()).then(|| v.join(", "))
        };
        out.push(Difference {
            path: name.to_string(),
            change: Change::Reads,
            a: only(pa, pb),
            b: only(pb, pa),
        });
    }
    out
}

/// An enum value as the format spells it (`kv_cache`, `discarded`).
fn words(v: &impl Serialize) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

/// Pools of the same name whose kind or sleep policy differ, in name order.
fn pool_changes(a: &Document, b: &Document) -> Vec<Difference> {
    fn by_name(d: &Document) -> BTreeMap<&str, &Pool> {
        d.pools().iter().map(|p| (p.name.as_str(), p)).collect()
    }
    let (pa, pb) = (by_name(a), by_name(b));
    let mut out = Vec::new();
    for (name, x) in &pa {
        let Some(y) = pb.get(name) else { continue };
        if x.kind != y.kind {
            out.push(Difference {
                path: name.to_string(),
                change: Change::Kind,
                a: Some(words(&x.kind)),
                b: Some(words(&y.kind)),
            });
        }
        if x.sleep != y.sleep {
            out.push(Difference {
                path: name.to_string(),
                change: Change::Sleep,
                a: Some(words(&x.sleep)),
                b: Some(words(&y.sleep)),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::format::{Contents, Digest, PoolKind, Registration, SleepPolicy};
    use crate::testkit::{live, manifest};

    #[test]
    fn same_model_is_same_and_every_change_is_named() {
        let m = manifest();
        let a = Document::Manifest(m.clone());
        assert!(diff(&a, &a).same);
        // Addresses do not matter; registration, layout, digest, tensor set do.
        let mut l = live(&m, Contents::Preserved);
        for t in &mut l.tensors {
            t.storage_base.0 += 0x100_0000;
        }
        l.allocations.clear();
        for t in &mut l.tensors {
            t.allocation = None;
        }
        let b = Document::Live(l.clone());
        let r = diff(&a, &b);
        assert!(r.same, "{r:?}");
        l.owners[0].registration = Registration::Buffer;
        l.tensors[1].shape = vec![64, 2];
        l.tensors[1].stride = vec![2, 1];
        l.tensors[2].digest = Some(Digest("sum64:ff".into()));
        l.owners.retain(|o| o.path != "model.scale_alias");
        let r = diff(&a, &Document::Live(l));
        let got: Vec<(&str, &Change)> = r
            .differences
            .iter()
            .map(|d| (d.path.as_str(), &d.change))
            .collect();
        assert_eq!(
            got,
            vec![
                ("model.meta", &Change::Digest),
                ("model.scale", &Change::Layout),
                ("model.scale_alias", &Change::Removed),
                ("model.w", &Change::Registration),
            ]
        );
        assert!(!r.same);
    }

    /// Regression: a pool whose sleep policy changed (`discarded` → `restored`), or whose
    /// kind did, was no difference.
    #[test]
    fn a_pool_whose_kind_or_sleep_policy_changed_is_named() {
        let m = manifest();
        let mut b = m.clone();
        let kv = b.pools.iter_mut().find(|p| p.name == "kv_cache").unwrap();
        assert_eq!(kv.sleep, SleepPolicy::Discarded);
        kv.sleep = SleepPolicy::Restored;
        kv.kind = PoolKind::Other;
        let r = diff(&Document::Manifest(m), &Document::Manifest(b));
        assert!(!r.same);
        assert!(r.differences.is_empty() && r.graphs.is_empty(), "{r:?}");
        let got: Vec<(&str, &Change, Option<&str>, Option<&str>)> = r
            .pools
            .iter()
            .map(|d| (d.path.as_str(), &d.change, d.a.as_deref(), d.b.as_deref()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("kv_cache", &Change::Kind, Some("kv_cache"), Some("other")),
                (
                    "kv_cache",
                    &Change::Sleep,
                    Some("discarded"),
                    Some("restored")
                ),
            ]
        );
    }

    #[test]
    fn graphs_that_captured_other_tensors_at_one_address_differ() {
        use crate::testkit::{W, alloc, owner, tensor, touch};
        // model.a, read by bs1, died; model.b took its block and bs8 read it. B tells the
        // two storages apart (numbered); A, as written before `storage`, merged them into
        // one tensor with both owners, so each graph there reads both paths.
        let base = |numbered: bool| {
            let mut m = manifest();
            m.allocations.push(alloc(6, W));
            let (mut x, mut y) = (tensor(3, 6, W), tensor(4, 6, W));
            if numbered {
                (x.storage, y.storage) = (Some(0), Some(1));
                m.tensors.extend([x, y]);
                m.owners.push(owner("model.a", 3, Registration::Buffer));
                m.owners.push(owner("model.b", 4, Registration::Buffer));
                m.graphs[0].nodes[0].touches.push(touch(Some(3), 6, 0));
                m.graphs[1].nodes[0].touches.push(touch(Some(4), 6, 0));
            } else {
                m.tensors.push(x);
                m.owners.push(owner("model.a", 3, Registration::Buffer));
                m.owners.push(owner("model.b", 3, Registration::Buffer));
                m.graphs[0].nodes[0].touches.push(touch(Some(3), 6, 0));
                m.graphs[1].nodes[0].touches.push(touch(Some(3), 6, 0));
            }
            crate::index::refs::check_manifest(&m).unwrap();
            Document::Manifest(m)
        };
        let (merged, apart) = (base(false), base(true));
        let r = diff(&merged, &apart);
        assert!(!r.same);
        let reads: Vec<(&str, Option<&str>, Option<&str>)> = r
            .graphs
            .iter()
            .filter(|d| d.change == Change::Reads)
            .map(|d| (d.path.as_str(), d.a.as_deref(), d.b.as_deref()))
            .collect();
        assert_eq!(
            reads,
            [
                ("bs1", Some("model.b"), None),
                ("bs8", Some("model.a"), None)
            ]
        );
        assert!(diff(&apart, &apart).same);
    }
}
