//! Verify: classify every touched storage view of a manifest, alone (capture-time checks)
//! or against a live snapshot (all checks). The rules are `docs/findings.md`.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;
use std::fmt;

use serde::Serialize;

use crate::allow::Allowlist;
use crate::format::{
    Addr, AllocState, Contents, Frame, Live, Manifest, PoolKind, Registration, SleepPolicy, Tensor,
    TensorId, ViewKey,
};
use crate::index::AddressIndex;
use crate::load::{Tables, check_live, check_manifest};

/// The kinds of finding, in report order.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FindingKind {
    Vanished,
    Drifted,
    Freed,
    Reused,
    Reshaped,
    Stale,
    Unregistered,
    Mispooled,
    Unowned,
    UnusedAllow,
}

impl FindingKind {
    pub const ALL: [FindingKind; 10] = [
        FindingKind::Vanished,
        FindingKind::Drifted,
        FindingKind::Freed,
        FindingKind::Reused,
        FindingKind::Reshaped,
        FindingKind::Stale,
        FindingKind::Unregistered,
        FindingKind::Mispooled,
        FindingKind::Unowned,
        FindingKind::UnusedAllow,
    ];

    /// The kinds a run without a live snapshot checks.
    pub const CAPTURE_TIME: [FindingKind; 3] = [
        FindingKind::Unregistered,
        FindingKind::Mispooled,
        FindingKind::Unowned,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::Vanished => "vanished",
            FindingKind::Drifted => "drifted",
            FindingKind::Freed => "freed",
            FindingKind::Reused => "reused",
            FindingKind::Reshaped => "reshaped",
            FindingKind::Stale => "stale",
            FindingKind::Unregistered => "unregistered",
            FindingKind::Mispooled => "mispooled",
            FindingKind::Unowned => "unowned",
            FindingKind::UnusedAllow => "unused_allow",
        }
    }

    /// One line on what the kind means, for reports.
    pub fn meaning(self) -> &'static str {
        match self {
            FindingKind::Vanished => "the owner path no longer resolves",
            FindingKind::Drifted => {
                "the owner now holds a tensor at another address; the graph reads the old one"
            }
            FindingKind::Freed => "the captured address is no longer an active allocation",
            FindingKind::Reused => "the captured address now lies in another owner's tensor",
            FindingKind::Reshaped => {
                "same address and owner, but shape, stride, dtype or offset changed"
            }
            FindingKind::Stale => "same address, owner and layout, but the contents are wrong",
            FindingKind::Unregistered => {
                "held only through plain attributes: sleep level 2 and reload do not restore it"
            }
            FindingKind::Mispooled => "a persistent tensor in a pool that sleep discards",
            FindingKind::Unowned => {
                "a captured address no owner, graph input or graph pool explains"
            }
            FindingKind::UnusedAllow => "an allowlist entry that allowed nothing",
        }
    }
}

impl fmt::Display for FindingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An owner path named by a finding.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct OwnerRef {
    pub path: String,
    pub registration: Registration,
}

/// One node parameter word that holds the subject's address.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct KernelRef {
    pub graph: String,
    pub node: u32,
    pub name: String,
    pub param: u32,
    pub offset: u32,
    pub addr: Addr,
}

/// One finding.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    /// Owner paths sorted and joined with ` = `, or the hex address (`unowned`), or the
    /// glob (`unused_allow`).
    pub subject: String,
    /// The owners that triggered the finding.
    pub owners: Vec<OwnerRef>,
    /// For `reused`: the owners now at the address. For `drifted`: the same paths, now.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub new_owners: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stride: Option<Vec<i64>>,
    /// The address the graphs hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub captured_addr: Option<Addr>,
    /// Where the owner's tensor is now (`drifted`), or the live layout's address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live_addr: Option<Addr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The graphs that hold the address: the set to recapture.
    pub graphs: Vec<String>,
    pub kernels: Vec<KernelRef>,
    /// One sentence on what was seen.
    pub detail: String,
    /// Where the captured storage was allocated, where the producer recorded it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub alloc_site: Vec<Frame>,
}

/// A finding an allowlist entry silenced.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Allowed {
    pub finding: Finding,
    pub allowed_by: String,
    pub reason: String,
}

/// Everything a run found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// The version of this report's JSON layout.
    pub format_version: u32,
    /// No finding (allowed ones aside).
    pub ok: bool,
    /// The kinds this run could check.
    pub checked: Vec<FindingKind>,
    pub summary: BTreeMap<FindingKind, usize>,
    pub findings: Vec<Finding>,
    pub allowed: Vec<Allowed>,
    /// Subjects (touched storage views) classified.
    pub subjects: usize,
    pub graphs: usize,
}

impl Report {
    /// Every graph some finding names, sorted: what to recapture.
    pub fn recapture(&self) -> Vec<String> {
        let set: BTreeSet<&String> = self.findings.iter().flat_map(|f| &f.graphs).collect();
        set.into_iter().cloned().collect()
    }
}

/// The report JSON layout version.
pub const REPORT_VERSION: u32 = 1;

/// A touched storage view and where it is touched.
struct Subject<'m> {
    /// Tensor indices (into `manifest.tensors`) with this view key.
    tensors: Vec<usize>,
    /// The first of them, for layout and address.
    tensor: &'m Tensor,
    /// Owner indices (into `manifest.owners`).
    owners: Vec<usize>,
}

/// Where a tensor is touched: (graph index, node index, touch index).
type TouchRef = (u32, u32, u32);

/// The touches of each manifest tensor, in one flat array (compressed rows): a million
/// touches cost two allocations, not one per tensor.
struct TouchIndex {
    start: Vec<u32>,
    refs: Vec<TouchRef>,
}

impl TouchIndex {
    /// Also returns the touches that name no tensor.
    fn new(m: &Manifest, mt: &Tables) -> (TouchIndex, Vec<TouchRef>) {
        let touches = || {
            m.graphs.iter().enumerate().flat_map(|(gi, g)| {
                g.nodes.iter().enumerate().flat_map(move |(ni, n)| {
                    n.touches
                        .iter()
                        .enumerate()
                        .map(move |(ki, t)| ((gi as u32, ni as u32, ki as u32), t.tensor))
                })
            })
        };
        let mut start = vec![0u32; m.tensors.len() + 1];
        let mut bare = Vec::new();
        for (r, t) in touches() {
            match t {
                Some(id) => start[mt.tensor_ix[&id] as usize + 1] += 1,
                None => bare.push(r),
            }
        }
        for i in 1..start.len() {
            start[i] += start[i - 1];
        }
        let mut fill = start.clone();
        let mut refs = vec![(0, 0, 0); start[m.tensors.len()] as usize];
        for (r, t) in touches() {
            if let Some(id) = t {
                let slot = &mut fill[mt.tensor_ix[&id] as usize];
                refs[*slot as usize] = r;
                *slot += 1;
            }
        }
        (TouchIndex { start, refs }, bare)
    }
}

impl std::ops::Index<usize> for TouchIndex {
    type Output = [TouchRef];
    fn index(&self, tensor: usize) -> &[TouchRef] {
        &self.refs[self.start[tensor] as usize..self.start[tensor + 1] as usize]
    }
}

struct Ctx<'m> {
    m: &'m Manifest,
    mt: &'m Tables,
    /// Touch references per manifest tensor index.
    touches_of: TouchIndex,
}

/// The graphs (sorted names) and node parameters of some touches, deduplicated.
fn kernel_refs(
    m: &Manifest,
    refs: impl Iterator<Item = TouchRef>,
) -> (Vec<String>, Vec<KernelRef>) {
    let mut graphs = BTreeSet::new();
    let mut kernels = Vec::new();
    for (g, n, k) in refs {
        let graph = &m.graphs[g as usize];
        let node = &graph.nodes[n as usize];
        let touch = &node.touches[k as usize];
        graphs.insert(graph.name.as_str());
        kernels.push(KernelRef {
            graph: graph.name.clone(),
            node: node.index,
            name: node.name.clone(),
            param: touch.param,
            offset: touch.offset,
            addr: touch.addr,
        });
    }
    kernels.sort();
    kernels.dedup();
    (graphs.into_iter().map(String::from).collect(), kernels)
}

impl<'m> Ctx<'m> {
    fn kernels(&self, tensors: &[usize]) -> (Vec<String>, Vec<KernelRef>) {
        kernel_refs(
            self.m,
            tensors
                .iter()
                .flat_map(|&t| self.touches_of[t].iter().copied()),
        )
    }

    fn pool_name(&self, t: &Tensor) -> Option<String> {
        t.pool
            .map(|p| self.m.pools[self.mt.pool_ix[&p] as usize].name.clone())
    }

    fn finding(
        &self,
        kind: FindingKind,
        s: &Subject<'m>,
        owners: &[usize],
        detail: String,
    ) -> Finding {
        let mut refs: Vec<OwnerRef> = owners
            .iter()
            .map(|&o| OwnerRef {
                path: self.m.owners[o].path.clone(),
                registration: self.m.owners[o].registration,
            })
            .collect();
        refs.sort();
        refs.dedup();
        let subject = refs
            .iter()
            .map(|o| o.path.as_str())
            .collect::<Vec<_>>()
            .join(" = ");
        let (graphs, kernels) = self.kernels(&s.tensors);
        let t = s.tensor;
        Finding {
            kind,
            subject,
            owners: refs,
            new_owners: Vec::new(),
            dtype: Some(t.dtype.clone()),
            shape: Some(t.shape.clone()),
            stride: Some(t.stride.clone()),
            captured_addr: Some(t.data_ptr()),
            live_addr: None,
            pool: self.pool_name(t),
            graphs,
            kernels,
            detail,
            alloc_site: t.alloc_site.clone(),
        }
    }
}

/// Why verify could not run: an inconsistent document handed in memory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    #[error("invalid manifest at `{}`: {}", .0.json_path, .0.message)]
    Manifest(crate::load::Invalid),
    #[error("invalid live snapshot at `{}`: {}", .0.json_path, .0.message)]
    Live(crate::load::Invalid),
}

/// Verifies a manifest, alone or against a live snapshot, under an allowlist. Checks both
/// documents first, so an inconsistent one is an error, never a panic.
pub fn verify(m: &Manifest, live: Option<&Live>, allow: &Allowlist) -> Result<Report, VerifyError> {
    let mt = check_manifest(m).map_err(VerifyError::Manifest)?;
    let lt = live
        .map(|l| check_live(l).map_err(VerifyError::Live))
        .transpose()?;
    Ok(verify_checked(m, &mt, live.zip(lt.as_ref()), allow))
}

/// [`verify`] for documents already checked (the loaders in [`crate::load`] return their
/// [`Tables`]); the tables must be those of these documents.
pub fn verify_checked(
    m: &Manifest,
    mt: &Tables,
    live: Option<(&Live, &Tables)>,
    allow: &Allowlist,
) -> Report {
    let (touches_of, bare) = TouchIndex::new(m, mt);
    let ctx = Ctx { m, mt, touches_of };

    // Subjects: touched tensors grouped by view key, in document order of first tensor.
    let mut by_key: FxHashMap<ViewKey<'_>, usize> = FxHashMap::default();
    let mut subjects: Vec<Subject<'_>> = Vec::new();
    for (ti, t) in m.tensors.iter().enumerate() {
        if ctx.touches_of[ti].is_empty() {
            continue;
        }
        let si = *by_key.entry(t.view_key()).or_insert_with(|| {
            subjects.push(Subject {
                tensors: Vec::new(),
                tensor: t,
                owners: Vec::new(),
            });
            subjects.len() - 1
        });
        subjects[si].tensors.push(ti);
        subjects[si].owners.extend_from_slice(&ctx.mt.owners_of[ti]);
    }

    let mut findings = Vec::new();
    for s in &subjects {
        capture_checks(&ctx, s, &mut findings);
    }
    unowned(&ctx, &bare, &subjects, &mut findings);
    if let Some((l, lt)) = live {
        let live_index = AddressIndex::new(&l.tensors, &l.allocations);
        let probes = ProbeIndex::new(l);
        for s in &subjects {
            live_checks(&ctx, l, lt, &live_index, &probes, s, &mut findings);
        }
    }

    let checked: Vec<FindingKind> = if live.is_some() {
        FindingKind::ALL.to_vec()
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
    Report {
        format_version: REPORT_VERSION,
        ok: findings.is_empty(),
        checked,
        summary,
        findings,
        allowed,
        subjects: subjects.len(),
        graphs: m.graphs.len(),
    }
}

fn persistent(ctx: &Ctx<'_>, s: &Subject<'_>) -> Vec<usize> {
    let mut p: Vec<usize> = s
        .owners
        .iter()
        .copied()
        .filter(|&o| ctx.m.owners[o].registration.is_persistent())
        .collect();
    p.sort_unstable();
    p.dedup();
    p
}

fn capture_checks(ctx: &Ctx<'_>, s: &Subject<'_>, out: &mut Vec<Finding>) {
    let p = persistent(ctx, s);
    if p.is_empty() {
        return;
    }
    if !p
        .iter()
        .any(|&o| ctx.m.owners[o].registration.is_registered())
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

/// The touches of one unowned subject, its allocation index and its tensor, if any.
type UnownedGroup<'m> = (Vec<TouchRef>, Option<usize>, Option<&'m Tensor>);

/// Touches that name no tensor, or a tensor with no owner, outside any graph pool.
fn unowned<'m>(ctx: &Ctx<'m>, bare: &[TouchRef], subjects: &[Subject<'m>], out: &mut Vec<Finding>) {
    let m = ctx.m;
    let mut index: Option<AddressIndex> = None;
    // subject string -> (touch refs, allocation index, first tensor)
    let mut groups: BTreeMap<Addr, UnownedGroup<'m>> = BTreeMap::new();
    let in_graph_pool = |a: Option<usize>| {
        a.and_then(|a| m.allocations[a].pool)
            .is_some_and(|p| m.pools[ctx.mt.pool_ix[&p] as usize].kind == PoolKind::Graph)
    };
    let mut add = |r: TouchRef, tensor: Option<&'m Tensor>, index: &mut Option<AddressIndex>| {
        let touch = &m.graphs[r.0 as usize].nodes[r.1 as usize].touches[r.2 as usize];
        let alloc = match touch.allocation {
            Some(a) => Some(ctx.mt.alloc_ix[&a] as usize),
            None => index
                .get_or_insert_with(|| AddressIndex::new(&m.tensors, &m.allocations))
                .allocations_at(touch.addr)
                .first()
                .copied(),
        };
        if in_graph_pool(alloc) {
            return;
        }
        let key = match (tensor, alloc) {
            (Some(t), _) => t.data_ptr(),
            (None, Some(a)) => m.allocations[a].base,
            (None, None) => touch.addr,
        };
        let e = groups.entry(key).or_insert((Vec::new(), alloc, tensor));
        e.0.push(r);
    };
    for &r in bare {
        add(r, None, &mut index);
    }
    for s in subjects {
        if s.owners.is_empty() {
            for &t in &s.tensors {
                for &r in &ctx.touches_of[t] {
                    add(r, Some(s.tensor), &mut index);
                }
            }
        }
    }
    for (key, (refs, alloc, tensor)) in groups {
        let (graphs, kernels) = kernel_refs(m, refs.into_iter());
        let pool = alloc
            .and_then(|a| m.allocations[a].pool)
            .map(|p| m.pools[ctx.mt.pool_ix[&p] as usize].name.clone());
        let detail = match (tensor, alloc) {
            (Some(_), _) => "a tensor the graphs read, but no owner path reaches it".to_string(),
            (None, Some(a)) => format!(
                "inside allocation {}+{} ({}), which no owner, graph input or graph pool explains",
                m.allocations[a].base,
                m.allocations[a].size,
                pool.as_deref().unwrap_or("no pool")
            ),
            (None, None) => "an address in no known allocation".to_string(),
        };
        out.push(Finding {
            kind: FindingKind::Unowned,
            subject: key.to_string(),
            owners: Vec::new(),
            new_owners: Vec::new(),
            dtype: tensor.map(|t| t.dtype.clone()),
            shape: tensor.map(|t| t.shape.clone()),
            stride: tensor.map(|t| t.stride.clone()),
            captured_addr: Some(key),
            live_addr: None,
            pool,
            graphs,
            kernels,
            detail,
            alloc_site: tensor.map(|t| t.alloc_site.clone()).unwrap_or_default(),
        });
    }
}

/// Probes sorted by address, remembering document order.
struct ProbeIndex {
    /// (addr, document index)
    sorted: Vec<(Addr, usize)>,
}

impl ProbeIndex {
    fn new(l: &Live) -> ProbeIndex {
        let mut sorted: Vec<(Addr, usize)> = l
            .probes
            .iter()
            .enumerate()
            .map(|(i, p)| (p.addr, i))
            .collect();
        sorted.sort_unstable();
        ProbeIndex { sorted }
    }

    /// The first probe in document order inside `[lo, hi)`.
    fn first_in(&self, lo: Addr, hi: Addr) -> Option<usize> {
        let start = self.sorted.partition_point(|&(a, _)| a < lo);
        self.sorted[start..]
            .iter()
            .take_while(|&&(a, _)| a < hi)
            .map(|&(_, i)| i)
            .min()
    }
}

#[allow(clippy::too_many_arguments)]
fn live_checks(
    ctx: &Ctx<'_>,
    l: &Live,
    lt: &Tables,
    live_index: &AddressIndex,
    probes: &ProbeIndex,
    s: &Subject<'_>,
    out: &mut Vec<Finding>,
) {
    let p = persistent(ctx, s);
    if p.is_empty() {
        return;
    }
    let t = s.tensor;
    let mut vanished = Vec::new();
    let mut drifted: Vec<(usize, &Tensor)> = Vec::new();
    let mut reshaped: Vec<(usize, &Tensor)> = Vec::new();
    let mut stale: Vec<(usize, &Tensor, &'static str)> = Vec::new();
    for &o in &p {
        let path = &ctx.m.owners[o].path;
        let Some(&lo) = lt.owner_by_path.get(path) else {
            vanished.push(o);
            continue;
        };
        let lten = lt.tensor(&l.tensors, l.owners[lo].tensor);
        if lten.data_ptr() != t.data_ptr() {
            drifted.push((o, lten));
        } else if !lten.same_layout(t) {
            reshaped.push((o, lten));
        } else if let Some(why) = stale_reason(l.event.contents, t, lten) {
            stale.push((o, lten, why));
        }
    }
    if !vanished.is_empty() {
        out.push(ctx.finding(
            FindingKind::Vanished,
            s,
            &vanished,
            "the owner path does not resolve in the live model; the graphs still read the captured address".into(),
        ));
    }
    if !drifted.is_empty() {
        let owners: Vec<usize> = drifted.iter().map(|d| d.0).collect();
        let new = drifted[0].1;
        let mut f = ctx.finding(
            FindingKind::Drifted,
            s,
            &owners,
            format!(
                "the owner now holds {} at {}; the graphs still read {}",
                new.layout(),
                new.data_ptr(),
                t.data_ptr()
            ),
        );
        f.live_addr = Some(new.data_ptr());
        out.push(f);
    }
    if !reshaped.is_empty() {
        let owners: Vec<usize> = reshaped.iter().map(|d| d.0).collect();
        let new = reshaped[0].1;
        let mut f = ctx.finding(
            FindingKind::Reshaped,
            s,
            &owners,
            format!(
                "captured as {} (offset {}), now {} (offset {})",
                t.layout(),
                t.offset,
                new.layout(),
                new.offset
            ),
        );
        f.live_addr = Some(new.data_ptr());
        out.push(f);
    }
    if !stale.is_empty() {
        let owners: Vec<usize> = stale.iter().map(|d| d.0).collect();
        out.push(ctx.finding(FindingKind::Stale, s, &owners, stale[0].2.to_string()));
    }

    // The captured address itself.
    let Some(pi) = probes.first_in(t.data_ptr(), t.end()) else {
        return;
    };
    let probe = &l.probes[pi];
    match probe.state {
        AllocState::Free | AllocState::Unmapped => {
            let state = if probe.state == AllocState::Free {
                "a free block of the allocator"
            } else {
                "unmapped"
            };
            out.push(ctx.finding(
                FindingKind::Freed,
                s,
                &p,
                format!("{} is now {state}; replay reads freed memory", probe.addr),
            ));
        }
        AllocState::Active => {
            let mine: BTreeSet<&str> = p.iter().map(|&o| ctx.m.owners[o].path.as_str()).collect();
            let mut others: BTreeSet<&str> = BTreeSet::new();
            let mut any_mine = false;
            live_index.for_each_view_at(t.data_ptr(), |vi| {
                for &lo in &lt.owners_of[vi] {
                    let path = l.owners[lo].path.as_str();
                    if mine.contains(path) {
                        any_mine = true;
                    } else {
                        others.insert(path);
                    }
                }
            });
            if !any_mine && !others.is_empty() {
                let mut f = ctx.finding(
                    FindingKind::Reused,
                    s,
                    &p,
                    format!(
                        "{} now lies in the tensor of {}; replay reads and writes another owner's data",
                        t.data_ptr(),
                        others.iter().copied().collect::<Vec<_>>().join(", ")
                    ),
                );
                f.new_owners = others.into_iter().map(str::to_string).collect();
                out.push(f);
            }
        }
    }
}

fn stale_reason(contents: Contents, captured: &Tensor, live: &Tensor) -> Option<&'static str> {
    let same_alg =
        |a: &crate::format::Digest, b: &crate::format::Digest| a.algorithm() == b.algorithm();
    if let (Some(r), Some(d)) = (&live.reference_digest, &live.digest)
        && same_alg(r, d)
        && r != d
    {
        return Some("the contents differ from what a fresh load puts there (reference digest)");
    }
    if contents == Contents::Preserved
        && let (Some(c), Some(d)) = (&captured.digest, &live.digest)
        && same_alg(c, d)
        && c != d
    {
        return Some(
            "the contents changed across an event that must preserve them (digest differs from capture)",
        );
    }
    None
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
mod tests {
    use super::*;
    use crate::format::{Digest, Registration};
    use crate::testkit::*;

    const SCALE: &str = "model.scale = model.scale_alias";

    #[test]
    fn capture_time_checks() {
        let m = manifest();
        let r = verify(&m, None, &Allowlist::default()).unwrap();
        assert_eq!(
            kinds(&r),
            vec![
                (FindingKind::Unregistered, SCALE.into()),
                (FindingKind::Mispooled, "model.meta".into()),
                (FindingKind::Unowned, format!("{:#x}", BASE + 4 * 0x1000)),
            ]
        );
        // The alias is one finding in the one graph that reads it.
        assert_eq!(r.findings[0].graphs, vec!["bs8".to_string()]);
        assert_eq!(r.findings[0].kernels[0].offset, 8);
        assert!(!r.ok);
        assert_eq!(r.subjects, 3);
    }

    #[test]
    fn identical_live_adds_nothing() {
        let m = manifest();
        let l = live(&m, Contents::Preserved);
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        assert_eq!(r.findings.len(), 3, "{:?}", kinds(&r));
        assert_eq!(r.checked.len(), FindingKind::ALL.len());
    }

    #[test]
    fn drifted_and_freed_name_the_new_address() {
        let m = manifest();
        let mut l = live(&m, Contents::Updated);
        l.allocations.push(alloc(5, W));
        let mut moved = tensor(0, 5, W);
        moved.id = TensorId(10);
        l.tensors.push(moved);
        l.owners[0].tensor = TensorId(10);
        l.probes[0].state = AllocState::Free;
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        let k = kinds(&r);
        assert!(
            k.contains(&(FindingKind::Drifted, "model.w".into())),
            "{k:?}"
        );
        assert!(k.contains(&(FindingKind::Freed, "model.w".into())), "{k:?}");
        let d = r
            .findings
            .iter()
            .find(|f| f.kind == FindingKind::Drifted)
            .unwrap();
        assert_eq!(d.live_addr, Some(Addr(BASE + 0x5000)));
        assert_eq!(d.captured_addr, Some(Addr(BASE)));
        assert_eq!(r.recapture(), vec!["bs1".to_string(), "bs8".to_string()]);
    }

    #[test]
    fn reused_names_the_new_owner_and_unmapped_is_freed() {
        let m = manifest();
        let mut l = live(&m, Contents::Updated);
        // model.w now lives elsewhere; its old storage belongs to model.other.
        l.allocations.push(alloc(5, W));
        let mut moved = tensor(0, 5, W);
        moved.id = TensorId(10);
        l.tensors.push(moved);
        l.owners[0].tensor = TensorId(10);
        l.owners
            .push(owner("model.other", 0, Registration::Parameter));
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        let f = r
            .findings
            .iter()
            .find(|f| f.kind == FindingKind::Reused)
            .expect("reused");
        assert_eq!(f.new_owners, vec!["model.other".to_string()]);

        let mut l = live(&m, Contents::Updated);
        l.probes[2].state = AllocState::Unmapped;
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        assert!(kinds(&r).contains(&(FindingKind::Freed, "model.meta".into())));
    }

    #[test]
    fn vanished_reshaped_and_stale() {
        let m = manifest();
        let mut l = live(&m, Contents::Preserved);
        l.owners.retain(|o| o.path != "model.meta");
        l.tensors[0].shape = vec![64, 2];
        l.tensors[0].stride = vec![2, 1];
        l.tensors[1].digest = Some(Digest("sum64:dead".into()));
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        let k = kinds(&r);
        assert!(
            k.contains(&(FindingKind::Vanished, "model.meta".into())),
            "{k:?}"
        );
        assert!(
            k.contains(&(FindingKind::Reshaped, "model.w".into())),
            "{k:?}"
        );
        assert!(k.contains(&(FindingKind::Stale, SCALE.into())), "{k:?}");

        // New weights may change contents, unless a reference says otherwise.
        let mut l = live(&m, Contents::Updated);
        l.tensors[1].digest = Some(Digest("sum64:dead".into()));
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        assert!(!kinds(&r).iter().any(|(k, _)| *k == FindingKind::Stale));
        l.tensors[1].reference_digest = Some(Digest("sum64:beef".into()));
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        assert!(kinds(&r).contains(&(FindingKind::Stale, SCALE.into())));
        // Digests of different algorithms are never compared.
        l.tensors[1].reference_digest = Some(Digest("sha256:beef".into()));
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        assert!(!kinds(&r).iter().any(|(k, _)| *k == FindingKind::Stale));
    }

    #[test]
    fn allowlist_silences_and_reports_unused_entries() {
        let m = manifest();
        let allow = Allowlist::parse(
            "[[allow]]\npath = \"model.scale*\"\nkinds = [\"unregistered\"]\nreason = \"scratch\"\n\
             [[allow]]\npath = \"model.gone\"\nreason = \"old\"\n\
             [[allow]]\npath = \"model.w\"\nkinds = [\"stale\"]\nreason = \"live-only\"\n",
        )
        .unwrap();
        let r = verify(&m, None, &allow).unwrap();
        let k = kinds(&r);
        assert!(
            !k.contains(&(FindingKind::Unregistered, SCALE.into())),
            "{k:?}"
        );
        assert_eq!(r.allowed.len(), 1);
        assert_eq!(r.allowed[0].reason, "scratch");
        // The stale-only entry is not judged without a live snapshot.
        assert!(
            k.contains(&(FindingKind::UnusedAllow, "model.gone".into())),
            "{k:?}"
        );
        assert!(
            !k.contains(&(FindingKind::UnusedAllow, "model.w".into())),
            "{k:?}"
        );
        let l = live(&m, Contents::Preserved);
        let r = verify(&m, Some(&l), &allow).unwrap();
        assert!(kinds(&r).contains(&(FindingKind::UnusedAllow, "model.w".into())));
    }

    #[test]
    fn kernel_entries_allow_unowned_scratch_and_are_reported_when_unused() {
        let m = manifest();
        // The unowned allocation is held by bs8's node k0 only.
        let allow = Allowlist::parse(
            "[[allow]]\nkernel = \"k*\"\nkinds = [\"unowned\"]\nreason = \"cuBLAS workspace\"\n\
             [[allow]]\nkernel = \"nvjet_*\"\nkinds = [\"unowned\"]\nreason = \"gone\"\n",
        )
        .unwrap();
        let r = verify(&m, None, &allow).unwrap();
        let k = kinds(&r);
        assert!(
            !k.iter().any(|(kind, _)| *kind == FindingKind::Unowned),
            "{k:?}"
        );
        assert_eq!(r.allowed.len(), 1);
        assert_eq!(r.allowed[0].allowed_by, "kernel:k*");
        assert!(
            k.contains(&(FindingKind::UnusedAllow, "kernel:nvjet_*".into())),
            "{k:?}"
        );
        // Several patterns: each holding kernel matches one of them.
        let allow = Allowlist::parse(
            "[[allow]]\nkernels = [\"nvjet*\", \"k0\"]\nkinds = [\"unowned\"]\nreason = \"x\"\n",
        )
        .unwrap();
        let r = verify(&m, None, &allow).unwrap();
        assert_eq!(r.allowed.len(), 1);
        assert_eq!(r.allowed[0].allowed_by, "kernel:nvjet*|k0");
        // A kernel entry never allows a finding held by no kernel, nor by another kernel.
        let allow = Allowlist::parse("[[allow]]\nkernel = \"k1\"\nreason = \"x\"\n").unwrap();
        let r = verify(&m, None, &allow).unwrap();
        assert!(
            kinds(&r)
                .iter()
                .any(|(kind, _)| *kind == FindingKind::Unowned)
        );
    }

    #[test]
    fn inconsistent_documents_are_errors_not_panics() {
        let mut m = manifest();
        m.graphs[0].nodes[0].touches[0].tensor = Some(TensorId(99));
        let e = verify(&m, None, &Allowlist::default()).unwrap_err();
        assert!(
            e.to_string()
                .contains("graphs[0].nodes[0].touches[0].tensor"),
            "{e}"
        );
        let m = manifest();
        let mut l = live(&m, Contents::Preserved);
        l.owners[0].tensor = TensorId(42);
        let e = verify(&m, Some(&l), &Allowlist::default()).unwrap_err();
        assert!(e.to_string().contains("owners[0].tensor"), "{e}");
    }
}
