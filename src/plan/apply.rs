//! Applying a plan: each graph patched all or nothing through a [`Patcher`] (the driver's
//! in `graphcheck::cuda`, or [`HostGraph`], the stand-in the tests use), and the manifest
//! that describes the patched graphs, so that a later verify checks what they now read.

use std::collections::{BTreeMap, HashMap};

use crate::model::format::{
    Addr, AllocState, Allocation, AllocationId, Live, Manifest, Owner, Probe, Tensor, TensorId,
};

use super::{Action, Edit, GraphPlan, Plan};

/// One graph's node parameters, as whatever holds the executable graph sees them.
pub trait Patcher {
    /// The 8-byte word at the edit's node, parameter and offset, as the graph holds it now.
    fn read(&mut self, e: &Edit) -> Result<u64, String>;
    /// Sets that word (on the executable graph, and on its template where one is kept).
    fn write(&mut self, e: &Edit, word: u64) -> Result<(), String>;
}

/// What applying a graph's edits came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every edit made and read back.
    Applied { edits: usize },
    /// No edit stands: the graph is as it was (`restored`), or, where undoing an edit
    /// failed too, in a state nobody planned (`restored: false`): it must not be replayed.
    Refused { why: String, restored: bool },
}

impl Outcome {
    pub fn applied(&self) -> bool {
        matches!(self, Outcome::Applied { .. })
    }
}

/// Patches one graph: every edit of its plan, or none. The words are first read and must
/// be the planned old ones (a graph changed since its manifest is refused untouched); a
/// write the patcher refuses undoes the edits made before it, in reverse; the new words
/// are read back, and a graph that does not hold them is restored.
pub fn apply_graph(p: &mut dyn Patcher, g: &GraphPlan) -> Outcome {
    if g.action != Action::Retarget {
        return Outcome::Refused {
            why: format!("the plan does not retarget {} ({:?})", g.graph, g.action),
            restored: true,
        };
    }
    for e in &g.edits {
        match p.read(e) {
            Ok(w) if w == e.old.0 => {}
            Ok(w) => {
                return Outcome::Refused {
                    why: format!(
                        "node {} param {} +{} holds {}, not the captured {}: the graph changed \
                         since its manifest",
                        e.node,
                        e.param,
                        e.offset,
                        Addr(w),
                        e.old
                    ),
                    restored: true,
                };
            }
            Err(why) => {
                return Outcome::Refused {
                    why: format!("reading node {} param {}: {why}", e.node, e.param),
                    restored: true,
                };
            }
        }
    }
    for (k, e) in g.edits.iter().enumerate() {
        if let Err(why) = p.write(e, e.new.0) {
            let why = format!(
                "the driver refused edit {} of {} (node {} param {} +{}): {why}",
                k + 1,
                g.edits.len(),
                e.node,
                e.param,
                e.offset
            );
            return undo(p, &g.edits[..k], why);
        }
    }
    for e in &g.edits {
        match p.read(e) {
            Ok(w) if w == e.new.0 => {}
            other => {
                let got = match other {
                    Ok(w) => Addr(w).to_string(),
                    Err(why) => why,
                };
                let why = format!(
                    "node {} param {} +{} reads back {got} after the edit, not {}",
                    e.node, e.param, e.offset, e.new
                );
                return undo(p, &g.edits, why);
            }
        }
    }
    Outcome::Applied {
        edits: g.edits.len(),
    }
}

/// Writes the old words of `made` back, last first.
fn undo(p: &mut dyn Patcher, made: &[Edit], why: String) -> Outcome {
    for e in made.iter().rev() {
        if let Err(again) = p.write(e, e.old.0) {
            return Outcome::Refused {
                why: format!(
                    "{why}; undoing node {} param {} +{} failed too ({again}): the graph is \
                     partly patched and must not be replayed; capture it again",
                    e.node, e.param, e.offset
                ),
                restored: false,
            };
        }
    }
    Outcome::Refused {
        why,
        restored: true,
    }
}

/// A graph's words in host memory, for tests: every word by (node, parameter, offset);
/// `fail_write` makes the n-th write (counted from 0) fail, `fail_undo` every write of an
/// old word after a failure.
#[derive(Clone, Debug, Default)]
pub struct HostGraph {
    pub words: BTreeMap<(u32, u32, u32), u64>,
    pub fail_write: Option<usize>,
    pub fail_undo: bool,
    pub writes: usize,
    failed: bool,
}

impl HostGraph {
    /// The words a manifest's graph holds.
    pub fn of(m: &Manifest, graph: &str) -> HostGraph {
        let mut h = HostGraph::default();
        for g in m.graphs.iter().filter(|g| g.name == graph) {
            for n in &g.nodes {
                for t in &n.touches {
                    h.words.insert((n.index, t.param, t.offset), t.addr.0);
                }
            }
        }
        h
    }
}

impl Patcher for HostGraph {
    fn read(&mut self, e: &Edit) -> Result<u64, String> {
        self.words
            .get(&(e.node, e.param, e.offset))
            .copied()
            .ok_or_else(|| format!("no word at node {} param {} +{}", e.node, e.param, e.offset))
    }

    fn write(&mut self, e: &Edit, word: u64) -> Result<(), String> {
        let n = self.writes;
        self.writes += 1;
        if self.fail_write == Some(n) || (self.failed && self.fail_undo) {
            self.failed = true;
            return Err("CUDA_ERROR_INVALID_VALUE (host stand-in)".into());
        }
        self.words.insert((e.node, e.param, e.offset), word);
        Ok(())
    }
}

/// The manifest after the graphs named in `applied` were patched by `plan`: each edited
/// touch names the new address and a tensor record of what its owner holds now (taken
/// from the live snapshot, with the live allocation and pool, matched by base and name);
/// those paths own the new record; each patched graph notes the retarget
/// (`Graph::retargets`). Where a graph not patched still reads the old record,
/// both stay, each with a storage number, and a path that held both is given once per
/// storage (`docs/format.md`).
pub fn retargeted_manifest(m: &Manifest, l: &Live, plan: &Plan, applied: &[String]) -> Manifest {
    let mut out = m.clone();
    // Live tensors by data pointer: several views may start at one address.
    let mut live_tensor: HashMap<Addr, Vec<&Tensor>> = HashMap::new();
    for t in &l.tensors {
        live_tensor.entry(t.data_ptr()).or_default().push(t);
    }
    let mut next_id = out.tensors.iter().map(|t| t.id.0 + 1).max().unwrap_or(0);
    let mut next_alloc = out
        .allocations
        .iter()
        .map(|a| a.id.0 + 1)
        .max()
        .unwrap_or(0);
    let numbered = crate::check::verify::one_session(m, l);
    // New records by the live tensor's data pointer and layout.
    let mut made: HashMap<(Addr, String), TensorId> = HashMap::new();
    let mut moved_from: BTreeMap<TensorId, TensorId> = BTreeMap::new(); // new -> old
    for gp in plan.graphs.iter().filter(|g| applied.contains(&g.graph)) {
        let Some(g) = out.graphs.iter_mut().find(|g| g.name == gp.graph) else {
            continue;
        };
        g.retargets.push(crate::model::format::RetargetRecord {
            event: "retarget".into(),
            edits: u32::try_from(gp.edits.len()).unwrap_or(u32::MAX),
            time: None,
        });
        for e in &gp.edits {
            let Some(n) = g.nodes.iter_mut().find(|n| n.index == e.node) else {
                continue;
            };
            let Some(t) = n
                .touches
                .iter_mut()
                .find(|t| t.param == e.param && t.offset == e.offset)
            else {
                continue;
            };
            let old_tensor = t.tensor;
            t.addr = e.new;
            // The live tensor whose span holds the new word, with the old tensor's layout.
            let old = old_tensor.and_then(|id| m.tensors.iter().find(|x| x.id == id));
            let target = old.and_then(|o| {
                let ptr = Addr(e.new.0.wrapping_sub(e.old.0.wrapping_sub(o.data_ptr().0)));
                live_tensor
                    .get(&ptr)?
                    .iter()
                    .copied()
                    .find(|t| t.shape == o.shape && t.stride == o.stride && t.dtype == o.dtype)
            });
            let Some(lt) = target else {
                t.tensor = None;
                continue;
            };
            let key = (lt.data_ptr(), lt.layout());
            // A record the manifest already has for that tensor (a later graph captured
            // it there): the edited words name it too.
            if !made.contains_key(&key)
                && let Some(id) = known_record(m, l, lt, numbered)
            {
                made.insert(key.clone(), id);
            }
            let id = *made.entry(key).or_insert_with(|| {
                let id = TensorId(next_id);
                next_id += 1;
                let mut x = lt.clone();
                x.id = id;
                // Numbers of one session name storage objects in both documents: the
                // live one's is the record's; other numbers are the snapshot's own.
                x.storage = if numbered { lt.storage } else { None };
                x.allocation = lt.allocation.and_then(|a| {
                    let la = l.allocations.iter().find(|x| x.id == a)?;
                    Some(match out.allocations.iter().find(|x| x.base == la.base) {
                        Some(have) => have.id,
                        None => {
                            let id = AllocationId(next_alloc);
                            next_alloc += 1;
                            out.allocations.push(Allocation {
                                id,
                                base: la.base,
                                size: la.size,
                                pool: la.pool.and_then(|p| pool_by_name(m, l, p)),
                            });
                            id
                        }
                    })
                });
                x.pool = lt.pool.and_then(|p| pool_by_name(m, l, p));
                out.tensors.push(x);
                id
            });
            if let Some(o) = old_tensor {
                moved_from.insert(id, o);
            }
            t.tensor = Some(id);
            t.allocation = out
                .tensors
                .iter()
                .find(|x| x.id == id)
                .and_then(|x| x.allocation);
        }
    }
    own_new_records(&mut out, l, &moved_from);
    out.allocations.sort_by_key(|a| a.base);
    out
}

/// The manifest's record of live tensor `lt`: its view, in a storage of its base and size,
/// owned by one of the paths that hold `lt` now (a dead storage once at its address is
/// another's), and of its number where both documents number storages alike.
fn known_record(m: &Manifest, l: &Live, lt: &Tensor, numbered: bool) -> Option<TensorId> {
    let paths: Vec<&str> = l
        .owners
        .iter()
        .filter(|o| o.tensor == lt.id)
        .map(|o| o.path.as_str())
        .collect();
    m.tensors
        .iter()
        .filter(|t| {
            t.view_key() == lt.view_key()
                && t.storage_base == lt.storage_base
                && t.storage_nbytes == lt.storage_nbytes
                && (!numbered || t.storage == lt.storage)
        })
        .find(|t| {
            m.owners
                .iter()
                .any(|o| o.tensor == t.id && paths.contains(&o.path.as_str()))
        })
        .map(|t| t.id)
}

/// The manifest pool of the live snapshot's pool `p`, by name.
fn pool_by_name(
    m: &Manifest,
    l: &Live,
    p: crate::model::format::PoolId,
) -> Option<crate::model::format::PoolId> {
    let name = &l.pools.iter().find(|x| x.id == p)?.name;
    m.pools.iter().find(|x| &x.name == name).map(|x| x.id)
}

/// Gives each new record the live owners of its tensor; an old record no touch names any
/// more loses the paths that moved, one still read keeps them, numbered apart.
fn own_new_records(out: &mut Manifest, l: &Live, moved_from: &BTreeMap<TensorId, TensorId>) {
    let touched: std::collections::HashSet<TensorId> = out
        .graphs
        .iter()
        .flat_map(|g| &g.nodes)
        .flat_map(|n| &n.touches)
        .filter_map(|t| t.tensor)
        .collect();
    let live_tensors: HashMap<(Addr, String), TensorId> = l
        .tensors
        .iter()
        .map(|t| ((t.data_ptr(), t.layout()), t.id))
        .collect();
    let mut next_storage = out
        .tensors
        .iter()
        .filter_map(|t| t.storage)
        .max()
        .map_or(0, |n| n + 1);
    for (&new, &old) in moved_from {
        let (ptr, old_read) = {
            let t = out
                .tensors
                .iter()
                .find(|t| t.id == new)
                .expect("made above");
            ((t.data_ptr(), t.layout()), touched.contains(&old))
        };
        let Some(&lid) = live_tensors.get(&ptr) else {
            continue;
        };
        let paths: Vec<Owner> = l
            .owners
            .iter()
            .filter(|o| o.tensor == lid)
            .cloned()
            .collect();
        if old_read {
            for id in [old, new] {
                let t = out
                    .tensors
                    .iter_mut()
                    .find(|t| t.id == id)
                    .expect("a record");
                if t.storage.is_none() {
                    t.storage = Some(next_storage);
                    next_storage += 1;
                }
            }
        } else {
            let moving: Vec<&str> = paths.iter().map(|o| o.path.as_str()).collect();
            out.owners
                .retain(|o| !(o.tensor == old && moving.contains(&o.path.as_str())));
        }
        for mut o in paths {
            o.tensor = new;
            if !out
                .owners
                .iter()
                .any(|x| x.path == o.path && x.tensor == new)
            {
                out.owners.push(o);
            }
        }
    }
}

/// The live snapshot `l` with a probe at every address of `m` it does not probe, as a
/// snapshot taken after the retarget would: active in the live allocation that holds it
/// (or in a live tensor's storage no allocation holds: pinned host memory), else unmapped.
pub fn probed_for(l: &Live, m: &Manifest) -> Live {
    let mut out = l.clone();
    let mut have: std::collections::HashSet<Addr> = out.probes.iter().map(|p| p.addr).collect();
    for t in m
        .graphs
        .iter()
        .flat_map(|g| &g.nodes)
        .flat_map(|n| &n.touches)
    {
        if !have.insert(t.addr) {
            continue;
        }
        let a = l
            .allocations
            .iter()
            .find(|a| a.base <= t.addr && t.addr.0 - a.base.0 < a.size);
        // Memory no allocation holds (pinned host memory) is active where a live tensor's
        // storage holds it, as the snapshot probes it.
        let held = l.tensors.iter().any(|x| {
            x.storage_base <= t.addr && t.addr.0 - x.storage_base.0 < x.storage_nbytes.max(1)
        });
        out.probes.push(Probe {
            addr: t.addr,
            state: if a.is_some() || held {
                AllocState::Active
            } else {
                AllocState::Unmapped
            },
            pool: a.and_then(|a| a.pool),
            allocation: a.map(|a| a.id),
        });
    }
    out
}
