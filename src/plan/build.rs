//! Making the plan: each finding of verify's report, graph by graph, becomes edits (an
//! owner holds a tensor of the captured layout at another address: every word of the
//! subject follows it) or a refusal (`docs/retarget.md` lists them). Ambiguities are
//! refusals, never guesses.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::check::finding::{Finding, FindingKind, Report};
use crate::model::format::{Addr, Graph, Live, Manifest, NodeKind, Tensor};

use super::{Action, Edit, GraphPlan, Plan, Refusal};

/// Why no plan could be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    #[error("a retarget plan needs the live checks: the report was made without a live snapshot")]
    NoLiveChecks,
}

/// A subject within one graph: its captured data pointer and layout.
type SubjectKey = (Addr, String, Vec<u64>, Vec<i64>);

fn key_of(f: &Finding) -> Option<SubjectKey> {
    Some((
        f.captured_addr?,
        f.dtype.clone()?,
        f.shape.clone()?,
        f.stride.clone()?,
    ))
}

/// Where a subject's owners took it: the one live tensor they all hold now, or why that
/// cannot be said.
type Move<'l> = Result<&'l Tensor, String>;

struct Ctx<'a> {
    m: &'a Manifest,
    l: &'a Live,
    /// Live tensor of each live owner path.
    live_at: HashMap<&'a str, &'a Tensor>,
    /// Manifest owners by tensor id.
    owners_of: HashMap<crate::model::format::TensorId, Vec<usize>>,
    /// Manifest tensors by data pointer (a scan of every tensor per finding made verify of
    /// a million touches 1.4 times slower).
    at_ptr: HashMap<Addr, Vec<usize>>,
}

impl<'a> Ctx<'a> {
    /// The lookups the findings of `r` need, and no others: only the manifest tensors at
    /// a drifted subject's data pointer, their owners, and the live tensors of those
    /// owners' paths are indexed (indexing every tensor and owner of a million-touch pair
    /// was most of what a plan added to verify).
    fn new(m: &'a Manifest, l: &'a Live, r: &Report) -> Ctx<'a> {
        let wanted: rustc_hash::FxHashSet<Addr> = r
            .findings
            .iter()
            .filter(|f| f.kind == FindingKind::Drifted)
            .filter_map(|f| f.captured_addr)
            .collect();
        let mut at_ptr: HashMap<Addr, Vec<usize>> = HashMap::new();
        let mut ids = rustc_hash::FxHashSet::default();
        if !wanted.is_empty() {
            for (i, t) in m.tensors.iter().enumerate() {
                if wanted.contains(&t.data_ptr()) {
                    at_ptr.entry(t.data_ptr()).or_default().push(i);
                    ids.insert(t.id);
                }
            }
        }
        let mut owners_of: HashMap<_, Vec<usize>> = HashMap::new();
        let mut paths = rustc_hash::FxHashSet::default();
        if !ids.is_empty() {
            for (i, o) in m.owners.iter().enumerate() {
                if ids.contains(&o.tensor) {
                    owners_of.entry(o.tensor).or_default().push(i);
                    paths.insert(o.path.as_str());
                }
            }
        }
        let mut live_at = HashMap::new();
        if !paths.is_empty() {
            // Ids are positions where the producer numbered them densely; else looked up.
            let by_id: Option<HashMap<_, &Tensor>> = (!l
                .tensors
                .iter()
                .enumerate()
                .all(|(i, t)| t.id.0 as usize == i))
            .then(|| l.tensors.iter().map(|t| (t.id, t)).collect());
            for o in &l.owners {
                if !paths.contains(o.path.as_str()) {
                    continue;
                }
                let t = match &by_id {
                    Some(map) => map.get(&o.tensor).copied(),
                    None => l.tensors.get(o.tensor.0 as usize),
                };
                if let Some(t) = t {
                    live_at.insert(o.path.as_str(), t);
                }
            }
        }
        Ctx {
            m,
            l,
            live_at,
            owners_of,
            at_ptr,
        }
    }

    /// Where the subject of a `drifted` finding went: every persistent path of its
    /// captured tensors (not only the ones that moved: an alias whose other path kept the
    /// captured tensor is split) must hold one live tensor of the captured layout.
    fn moved(&self, f: &Finding) -> Move<'a> {
        let (ptr, dtype, shape, stride) = key_of(f).ok_or("the finding names no tensor")?;
        let mine: BTreeSet<&str> = f.owners.iter().map(|o| o.path.as_str()).collect();
        let captured: Vec<&Tensor> = self
            .at_ptr
            .get(&ptr)
            .into_iter()
            .flatten()
            .map(|&i| &self.m.tensors[i])
            .filter(|t| {
                t.data_ptr() == ptr && t.dtype == dtype && t.shape == shape && t.stride == stride
            })
            .filter(|t| {
                self.owners_of.get(&t.id).is_some_and(|os| {
                    os.iter()
                        .any(|&o| mine.contains(self.m.owners[o].path.as_str()))
                })
            })
            .collect();
        let Some(first) = captured.first() else {
            return Err("no tensor of the manifest is the captured one".into());
        };
        let paths: BTreeSet<&str> = captured
            .iter()
            .flat_map(|t| &self.owners_of[&t.id])
            .map(|&o| &self.m.owners[o])
            .filter(|o| o.registration.is_persistent())
            .map(|o| o.path.as_str())
            .collect();
        let mut kept = Vec::new();
        let mut went: BTreeMap<Addr, (&Tensor, Vec<&str>)> = BTreeMap::new();
        for p in &paths {
            match self.live_at.get(p) {
                None => {}
                Some(t) if t.data_ptr() == ptr => kept.push(*p),
                Some(t) => went
                    .entry(t.data_ptr())
                    .or_insert((t, Vec::new()))
                    .1
                    .push(p),
            }
        }
        if !kept.is_empty() {
            return Err(format!(
                "an alias split: {} still {} the captured tensor at {ptr} while {} moved; \
                 which of them the graph means cannot be told",
                quoted(&kept),
                if kept.len() == 1 { "holds" } else { "hold" },
                quoted(
                    &went
                        .values()
                        .flat_map(|(_, p)| p.iter().copied())
                        .collect::<Vec<_>>()
                )
            ));
        }
        let (new, moved) = match went.len() {
            0 => return Err("no owner of the captured tensor holds a tensor now".into()),
            1 => went.into_values().next().expect("one"),
            _ => {
                let places: Vec<String> = went
                    .iter()
                    .map(|(a, (_, p))| format!("{} at {a}", quoted(p)))
                    .collect();
                return Err(format!(
                    "the owners of one captured tensor moved to different places ({}): \
                     which one the graph should follow cannot be told",
                    places.join("; ")
                ));
            }
        };
        if !(new.shape == first.shape
            && new.stride == first.stride
            && new.dtype == first.dtype
            && new.itemsize == first.itemsize
            && new.nbytes == first.nbytes
            && new.device == first.device)
        {
            return Err(format!(
                "{} now hold {} on {}, captured as {} on {}: a kernel compiled for one layout \
                 does not read another",
                quoted(&moved),
                new.layout(),
                new.device,
                first.layout(),
                first.device
            ));
        }
        Ok(new)
    }
}

/// Whether a kernel is one of NCCL's: its device kernels (`ncclDevKernel_*`, `ncclKernel_*`)
/// or, in a one-rank group, the local reduction NCCL launches instead (`oneRankReduce`,
/// from its `onerank.cu`: the name torch 2.11's NCCL gives on the H200).
fn is_nccl(name: &str) -> bool {
    // Asked of every kernel of a graph with edits: substring searches, no allocation (a
    // case-folding scan of each name was 6 % of a million-touch verify).
    name.contains("nccl") || name.contains("NCCL") || name.contains("oneRankReduce")
}

/// A kernel name cut to its first 80 characters.
fn short(name: &str) -> String {
    match name.char_indices().nth(80) {
        Some((i, _)) => format!("{}…", &name[..i]),
        None => name.to_string(),
    }
}

fn quoted(paths: &[&str]) -> String {
    paths
        .iter()
        .map(|p| format!("`{p}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Graph `g`'s node of walk index `index`: nodes are in walk order, so by bisection (a
/// linear find per word was most of the plan's time at a million touches).
fn node(g: &Graph, index: u32) -> Option<&crate::model::format::Node> {
    match g.nodes.binary_search_by_key(&index, |n| n.index) {
        Ok(i) => Some(&g.nodes[i]),
        Err(_) => g.nodes.iter().find(|n| n.index == index),
    }
}

/// Why a node's words cannot be changed in an instantiated graph, if so.
fn unchangeable(g: &Graph, index: u32) -> Option<String> {
    let Some(n) = node(g, index) else {
        return Some(format!("node {index} is not in the manifest's graph"));
    };
    if let Some(p) = n.parent {
        return Some(format!(
            "node {index} lies in the body of node {p} (a child graph or a conditional \
             body): the driver changes the executable graph's own nodes, not a body's"
        ));
    }
    match n.kind {
        NodeKind::Kernel if is_nccl(&n.name) => Some(format!(
            "node {index} is an NCCL collective ({}): its arguments point into the \
             communicator's state, which every rank's graph shares",
            short(&n.name)
        )),
        NodeKind::Kernel | NodeKind::Memset | NodeKind::Memcpy => None,
        other => Some(format!(
            "node {index} is a {other} node: the memory it names is the graph's own"
        )),
    }
}

/// The plan for a manifest, its live snapshot and verify's report of the two.
pub fn plan(m: &Manifest, l: &Live, r: &Report) -> Result<Plan, PlanError> {
    if !r.checked.contains(&FindingKind::Drifted) {
        return Err(PlanError::NoLiveChecks);
    }
    let ctx = Ctx::new(m, l, r);
    // Where each drifted subject went (one answer per subject, whichever graph asks).
    let mut moves: HashMap<SubjectKey, Move<'_>> = HashMap::new();
    for f in &r.findings {
        if f.kind == FindingKind::Drifted
            && let Some(k) = key_of(f)
        {
            let mv = ctx.moved(f);
            moves
                .entry(k)
                .and_modify(|was| {
                    if let (Ok(a), Ok(b)) = (&*was, &mv)
                        && a.data_ptr() != b.data_ptr()
                    {
                        *was = Err("two findings of one subject name different new places".into());
                    }
                })
                .or_insert(mv);
        }
    }
    // Each graph's findings, in report order (one pass, not one per graph).
    let mut by_graph: HashMap<&str, Vec<&Finding>> = HashMap::new();
    for f in &r.findings {
        for g in &f.graphs {
            by_graph.entry(g.as_str()).or_default().push(f);
        }
    }
    let mut graphs = Vec::with_capacity(m.graphs.len());
    for g in &m.graphs {
        let mut edits: BTreeMap<(u32, u32, u32), Edit> = BTreeMap::new();
        let mut refusals: BTreeSet<Refusal> = BTreeSet::new();
        let refuse = |refusals: &mut BTreeSet<Refusal>, f: &Finding, why: String| {
            refusals.insert(Refusal {
                kind: f.kind.to_string(),
                subject: f.subject.clone(),
                why,
            });
        };
        for f in by_graph.get(g.name.as_str()).into_iter().flatten() {
            match f.kind {
                FindingKind::Drifted => {
                    let k = key_of(f).expect("drifted names a tensor");
                    let new = match &moves[&k] {
                        Ok(t) => *t,
                        Err(why) => {
                            refuse(&mut refusals, f, why.clone());
                            continue;
                        }
                    };
                    let old = k.0;
                    for kr in f.kernels.iter().filter(|kr| kr.graph == g.name) {
                        let Some(delta) = kr.addr.0.checked_sub(old.0) else {
                            refuse(
                                &mut refusals,
                                f,
                                format!("the word at node {} lies before the tensor", kr.node),
                            );
                            continue;
                        };
                        if let Some(why) = unchangeable(g, kr.node) {
                            refusals.insert(Refusal {
                                kind: "node".into(),
                                subject: f.subject.clone(),
                                why,
                            });
                            continue;
                        }
                        let node_kind = node(g, kr.node)
                            .map(|n| n.kind.to_string())
                            .unwrap_or_default();
                        let edit = Edit {
                            node: kr.node,
                            node_kind,
                            param: kr.param,
                            offset: kr.offset,
                            old: kr.addr,
                            new: Addr(new.data_ptr().0.wrapping_add(delta)),
                            subject: f.subject.clone(),
                        };
                        match edits.get(&(kr.node, kr.param, kr.offset)) {
                            Some(e) if e.new != edit.new => {
                                refusals.insert(Refusal {
                                    kind: "ambiguous".into(),
                                    subject: format!("{} and {}", e.subject, edit.subject),
                                    why: format!(
                                        "the word at node {} param {} +{} belongs to two tensors \
                                         that moved apart ({} and {})",
                                        kr.node, kr.param, kr.offset, e.new, edit.new
                                    ),
                                });
                            }
                            _ => {
                                edits.insert((kr.node, kr.param, kr.offset), edit);
                            }
                        }
                    }
                }
                FindingKind::Freed | FindingKind::Reused | FindingKind::Vanished => {
                    let fixed = key_of(f)
                        .and_then(|k| moves.get(&k))
                        .is_some_and(Result::is_ok);
                    if !fixed {
                        let why = match f.kind {
                            FindingKind::Freed => {
                                "the captured memory is free and no owner of it moved: there \
                                 is nothing to point the graph at"
                            }
                            FindingKind::Reused => {
                                "the captured memory is another owner's now and no owner of \
                                 the captured tensor moved: there is nothing to point the \
                                 graph at"
                            }
                            _ => {
                                "no owner holds the captured tensor now: there is nothing to \
                                 point the graph at"
                            }
                        };
                        refuse(&mut refusals, f, why.into());
                    }
                }
                FindingKind::Reshaped => refuse(
                    &mut refusals,
                    f,
                    "the owner holds the captured memory under another layout: a kernel \
                     compiled for one layout does not read another"
                        .into(),
                ),
                FindingKind::Stale => refuse(
                    &mut refusals,
                    f,
                    "the contents at the captured address were lost or changed where they \
                     are: restore them (or reload) and capture again; no address moved"
                        .into(),
                ),
                // Capture-time findings do not change what a replay reads now; ranks and
                // allowlists are not a graph's words.
                _ => {}
            }
        }
        if !edits.is_empty() {
            if let Some(n) = g.nodes.iter().find(|n| n.opaque.is_some()) {
                refusals.insert(Refusal {
                    kind: "node".into(),
                    subject: format!("node {}", n.index),
                    why: format!(
                        "node {} is opaque ({}): a pointer to a moved tensor there could not be changed",
                        n.index,
                        n.opaque.as_deref().unwrap_or_default()
                    ),
                });
            }
            // A graph with a collective is not retargeted, whatever moved: every rank's
            // graph would have to be patched alike, and with more than one rank NCCL's
            // kernels take their buffers from its own device-side work storage, which no
            // walk reads. (A one-rank group's `oneRankReduce` holds its pointers as plain
            // parameters, as the H200 shows, and is refused all the same.)
            if let Some(n) = g
                .nodes
                .iter()
                .find(|n| n.kind == NodeKind::Kernel && is_nccl(&n.name))
            {
                refusals.insert(Refusal {
                    kind: "node".into(),
                    subject: format!("node {}", n.index),
                    why: format!(
                        "node {} is an NCCL collective ({}): graphcheck does not retarget a \
                         graph with a collective (every rank's graph would have to change \
                         alike, and NCCL keeps the buffers of a collective of several ranks \
                         in device-side work storage that no walk reads)",
                        n.index,
                        short(&n.name)
                    ),
                });
            }
            if let Some(u) = g.unread.first() {
                refusals.insert(Refusal {
                    kind: "node".into(),
                    subject: format!("node {}", u.index),
                    why: format!(
                        "node {} ({}) was not read ({}): a pointer to a moved tensor there \
                         could not be changed",
                        u.index, u.node_type, u.reason
                    ),
                });
            }
        }
        let action = if !refusals.is_empty() {
            Action::Recapture
        } else if !edits.is_empty() {
            Action::Retarget
        } else {
            Action::Keep
        };
        graphs.push(GraphPlan {
            graph: g.name.clone(),
            action,
            edits: edits.into_values().collect(),
            refusals: refusals.into_iter().collect(),
        });
    }
    let _ = ctx.l;
    Ok(Plan::of(graphs))
}
