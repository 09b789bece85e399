//! Verify: classify every touched storage view of a manifest, alone (capture-time checks)
//! or against a live snapshot (all checks). The rules are `docs/findings.md`.

use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;
use std::fmt;

use serde::Serialize;

use crate::check::allow::Allowlist;
use crate::document::format::{
    Addr, AllocState, Contents, Frame, Live, Manifest, PoolKind, Registration, SleepPolicy, Tensor,
    TensorId, ViewKey,
};
use crate::document::index::{AddressIndex, IntervalIndex};
use crate::document::load::{Tables, check_live, check_manifest};
use crate::document::owner_path::{Segment, parse};

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

/// Whether a finding fails the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Severity {
    /// Fails the run: `ok` is false, exit code 1.
    Error,
    /// Shown, but the run stays `ok`: an allowlist entry that allowed nothing (unless the
    /// allowlist denies unused entries, `--deny-unused-allow`).
    Warning,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
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
    /// Whether it fails the run; every kind but `unused_allow` is always an error.
    pub severity: Severity,
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
    /// No finding of severity `error` (allowed ones and warnings aside).
    pub ok: bool,
    /// The kinds this run could check.
    pub checked: Vec<FindingKind>,
    pub summary: BTreeMap<FindingKind, usize>,
    pub findings: Vec<Finding>,
    pub allowed: Vec<Allowed>,
    /// Subjects (touched storage views) classified.
    pub subjects: usize,
    pub graphs: usize,
    /// Nodes whose addresses the walk could not read (the graphs' `unread` nodes and
    /// nodes marked `opaque`): whatever they hold is not checked. Left out when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unread_nodes: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Report {
    /// The findings that fail the run.
    pub fn errors(&self) -> impl Iterator<Item = &Finding> {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Error)
    }

    /// The findings shown that do not fail the run.
    pub fn warnings(&self) -> impl Iterator<Item = &Finding> {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Warning)
    }

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
    /// Manifest tensors by the span of their storage, built on first use: only subjects
    /// held through plain attributes, or whose owner paths moved, need it.
    storages: OnceCell<IntervalIndex<usize>>,
    /// Manifest tensors by the span of their view, built on first use.
    views: OnceCell<IntervalIndex<usize>>,
}

/// Whether the storage of `storage` holds every byte of `view`'s span.
fn storage_holds(storage: &Tensor, view: &Tensor) -> bool {
    let start = view.data_ptr().0;
    let end = start.saturating_add(view.nbytes);
    storage.storage_base.0 <= start
        && end
            <= storage
                .storage_base
                .0
                .saturating_add(storage.storage_nbytes)
}

/// Whether two tensors are views of one storage: same base, same size.
fn same_storage(a: &Tensor, b: &Tensor) -> bool {
    a.storage_base == b.storage_base && a.storage_nbytes == b.storage_nbytes
}

/// Whether two owner paths name slots of one container that differ only in one index
/// (`ys[2]` and `ys[1]`, `experts[3].w` and `experts[2].w`): where a list insert or delete
/// moves a tensor.
fn shift_siblings(a: &str, b: &str) -> bool {
    index_shift(a, b).is_some()
}

/// Where `b` differs from `a` in exactly one list index: `b`'s index minus `a`'s.
fn index_shift(a: &str, b: &str) -> Option<i64> {
    let (Ok(x), Ok(y)) = (parse(a), parse(b)) else {
        return None;
    };
    if x.len() != y.len() {
        return None;
    }
    let mut differ = x.iter().zip(&y).filter(|(p, q)| p != q);
    match (differ.next(), differ.next()) {
        (Some((Segment::Index(i), Segment::Index(j))), None) => j.checked_sub(*i),
        _ => None,
    }
}

/// Whether `path`, now holding the manifest tensor `now` (captured under other paths),
/// took part in a shift of its list by an insert or a delete: the tensor now at `path`
/// came from a sibling index by the same displacement by which the subject moved to one of
/// its `carriers`. A swap or any other permutation moves them by different displacements,
/// and an alias (`c_strides2 = c_strides1`) by none: those stay `drifted`, since the
/// model now reads another tensor through `path` than the graphs do.
fn shifted(ctx: &Ctx<'_>, path: &str, now: usize, carriers: &BTreeSet<&str>) -> bool {
    let came: Vec<i64> = ctx.mt.owners_of[now]
        .iter()
        .filter_map(|&o| index_shift(&ctx.m.owners[o].path, path))
        .collect();
    carriers
        .iter()
        .filter_map(|c| index_shift(path, c))
        .any(|went| went != 0 && came.contains(&went))
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
    /// Indices of the manifest tensors whose storage holds every byte of `t`'s view
    /// (`t`'s own tensors among them).
    fn holders(&self, t: &Tensor) -> Vec<usize> {
        let index = self.storages.get_or_init(|| {
            IntervalIndex::new(
                self.m
                    .tensors
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        let base = t.storage_base.0;
                        (base, base.saturating_add(t.storage_nbytes), i)
                    })
                    .collect(),
            )
        });
        let mut out = Vec::new();
        index.stab(t.data_ptr().0, |_, _, i| {
            if storage_holds(&self.m.tensors[i], t) {
                out.push(i);
            }
        });
        out
    }

    /// The manifest tensor with `l`'s view and storage, if any: a live tensor graphcheck
    /// already knew at capture.
    fn known(&self, l: &Tensor) -> Option<usize> {
        let index = self.views.get_or_init(|| {
            IntervalIndex::new(
                self.m
                    .tensors
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (t.data_ptr().0, t.end().0, i))
                    .collect(),
            )
        });
        let mut found = None;
        index.stab(l.data_ptr().0, |_, _, i| {
            let m = &self.m.tensors[i];
            if m.view_key() == l.view_key() && same_storage(m, l) {
                found.get_or_insert(i);
            }
        });
        found
    }

    /// The registered owners (parameter, buffer, held) of the manifest tensors that share
    /// `t`'s storage and whose own view covers `t`'s bytes: a view into a registered
    /// tensor is registered through it, because sleep and an in-place reload
    /// (`param.copy_`) restore those bytes. Bytes of the storage outside every registered
    /// view are restored by sleep but not by an in-place reload, so they do not count.
    fn registered_through(&self, t: &Tensor) -> Vec<usize> {
        let mut owners: Vec<usize> = self
            .holders(t)
            .into_iter()
            .filter(|&i| {
                let r = &self.m.tensors[i];
                r.data_ptr() <= t.data_ptr() && t.end() <= r.end()
            })
            .flat_map(|i| self.mt.owners_of[i].iter().copied())
            .filter(|&o| self.m.owners[o].registration.is_registered())
            .collect();
        owners.sort_unstable();
        owners.dedup();
        owners
    }

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
            severity: Severity::Error,
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
    Manifest(crate::document::load::Invalid),
    #[error("invalid live snapshot at `{}`: {}", .0.json_path, .0.message)]
    Live(crate::document::load::Invalid),
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

/// [`verify`] for documents already checked (the loaders in [`crate::document::load`] return their
/// [`Tables`]); the tables must be those of these documents.
pub fn verify_checked(
    m: &Manifest,
    mt: &Tables,
    live: Option<(&Live, &Tables)>,
    allow: &Allowlist,
) -> Report {
    let (touches_of, bare) = TouchIndex::new(m, mt);
    let ctx = Ctx {
        m,
        mt,
        touches_of,
        storages: OnceCell::new(),
        views: OnceCell::new(),
    };

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
            severity: Severity::Error,
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

/// What became of one persistent owner path of a subject in the live snapshot.
#[derive(Clone, Copy)]
enum PathNow<'l> {
    /// It resolves to a tensor at the captured data pointer.
    Kept(&'l Tensor),
    /// It no longer resolves.
    Gone,
    /// It resolves to a tensor at another address, and the manifest tensor with that view
    /// and storage, if any: then the path may have shifted onto another captured tensor.
    Rebound(&'l Tensor, Option<usize>),
}

/// Live owner paths, none of them the subject's own, that still reach the captured bytes.
#[derive(Default)]
struct Carriers<'l> {
    paths: BTreeSet<&'l str>,
    /// A carrying tensor with the captured view and storage, whose contents can be
    /// compared with the captured digest.
    same_view: Option<&'l Tensor>,
}

/// The carriers of a subject (`docs/findings.md`, "Identity follows the storage"):
/// - a persistent path that held, at capture, a storage holding the captured bytes, and
///   holds that same storage now (a view's base, another view of the storage);
/// - a persistent path that differs from one of the subject's paths only in one index and
///   holds the captured view and storage, with contents that are not stale (a list shifted
///   by an insert or a delete), where either no path of the subject was rebound to a tensor
///   the manifest does not know (`all_shift`), or the tensor that path held at capture is
///   still held (it shifted on). A sibling that took the block of a tensor rebound to a new
///   one, and whose own old tensor is gone, took freed memory: not a carrier.
#[allow(clippy::too_many_arguments)]
fn carriers<'l>(
    ctx: &Ctx<'_>,
    l: &'l Live,
    lt: &Tables,
    live_index: &AddressIndex,
    s: &Subject<'_>,
    mine: &BTreeSet<&str>,
    all_shift: bool,
) -> Carriers<'l> {
    let t = s.tensor;
    let mut c = Carriers::default();
    for mi in ctx.holders(t) {
        let held = &ctx.m.tensors[mi];
        for &o in &ctx.mt.owners_of[mi] {
            let owner = &ctx.m.owners[o];
            if !owner.registration.is_persistent() || mine.contains(owner.path.as_str()) {
                continue;
            }
            let Some(&lo) = lt.owner_by_path.get(&owner.path) else {
                continue;
            };
            let now = &l.owners[lo];
            let lq = lt.tensor(&l.tensors, now.tensor);
            if now.registration.is_persistent() && same_storage(lq, held) {
                c.paths.insert(now.path.as_str());
                if lq.view_key() == t.view_key() && c.same_view.is_none() {
                    c.same_view = Some(lq);
                }
            }
        }
    }
    live_index.for_each_view_at(t.data_ptr(), |vi| {
        let lq = &l.tensors[vi];
        if lq.view_key() != t.view_key()
            || !same_storage(lq, t)
            || stale_reason(l.event.contents, t, lq).is_some()
        {
            return;
        }
        for &lo in &lt.owners_of[vi] {
            let q = &l.owners[lo];
            if q.registration.is_persistent()
                && !mine.contains(q.path.as_str())
                && mine.iter().any(|p| shift_siblings(p, &q.path))
                && (all_shift || still_held(ctx, l, lt, live_index, &q.path))
            {
                c.paths.insert(q.path.as_str());
                c.same_view.get_or_insert(lq);
            }
        }
    });
    c
}

/// Whether the tensor `path` held at capture is still held, by any persistent owner, with
/// its view and storage.
fn still_held(ctx: &Ctx<'_>, l: &Live, lt: &Tables, live_index: &AddressIndex, path: &str) -> bool {
    let Some(&o) = ctx.mt.owner_by_path.get(path) else {
        return false;
    };
    let was = ctx.mt.tensor(&ctx.m.tensors, ctx.m.owners[o].tensor);
    let mut held = false;
    live_index.for_each_view_at(was.data_ptr(), |vi| {
        let t = &l.tensors[vi];
        held |= t.view_key() == was.view_key()
            && same_storage(t, was)
            && lt.owners_of[vi]
                .iter()
                .any(|&lo| l.owners[lo].registration.is_persistent());
    });
    held
}

/// `names` as `` `a`, `b` ``.
fn quoted<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names
        .into_iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
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
    let now: Vec<(usize, PathNow<'_>)> = p
        .iter()
        .map(|&o| {
            let st = match lt.owner_by_path.get(&ctx.m.owners[o].path) {
                None => PathNow::Gone,
                Some(&lo) => {
                    let lten = lt.tensor(&l.tensors, l.owners[lo].tensor);
                    if lten.data_ptr() == t.data_ptr() {
                        PathNow::Kept(lten)
                    } else {
                        PathNow::Rebound(lten, ctx.known(lten))
                    }
                }
            };
            (o, st)
        })
        .collect();
    let mine: BTreeSet<&str> = p.iter().map(|&o| ctx.m.owners[o].path.as_str()).collect();
    let any_kept = now.iter().any(|(_, n)| matches!(n, PathNow::Kept(_)));
    let all_shift = !now
        .iter()
        .any(|(_, n)| matches!(n, PathNow::Rebound(_, None)));
    // Only subjects whose paths moved, or whose address another owner holds, need them.
    let carried = OnceCell::new();
    let carriers = || carried.get_or_init(|| carriers(ctx, l, lt, live_index, s, &mine, all_shift));
    // The captured bytes are still reached: through one of the subject's own paths, or
    // through a carrier. Then a path that went away, or that shifted onto another captured
    // tensor, is no hazard: identity follows the storage.
    let reached = any_kept || !carriers().paths.is_empty();

    let mut vanished = Vec::new();
    let mut drifted: Vec<(usize, &Tensor, Option<usize>)> = Vec::new();
    let mut reshaped: Vec<(usize, &Tensor)> = Vec::new();
    let mut stale: Vec<(usize, &Tensor, &'static str)> = Vec::new();
    for &(o, n) in &now {
        match n {
            PathNow::Gone if !reached => vanished.push(o),
            PathNow::Gone => {}
            PathNow::Rebound(_, Some(k))
                if reached && shifted(ctx, &ctx.m.owners[o].path, k, &carriers().paths) => {}
            PathNow::Rebound(lten, known) => drifted.push((o, lten, known)),
            PathNow::Kept(lten) => {
                if !lten.same_layout(t) {
                    reshaped.push((o, lten));
                } else if let Some(why) = stale_reason(l.event.contents, t, lten) {
                    stale.push((o, lten, why));
                }
            }
        }
    }
    if !vanished.is_empty() {
        out.push(ctx.finding(
            FindingKind::Vanished,
            s,
            &vanished,
            "the owner path does not resolve in the live model, and no other owner holds the captured storage; the graphs still read the captured address".into(),
        ));
    }
    if !drifted.is_empty() {
        let owners: Vec<usize> = drifted.iter().map(|d| d.0).collect();
        let (_, new, known) = drifted[0];
        // Where the path now holds a tensor captured under other paths (a list shifted by
        // a delete), say which: the captured one is the one that went.
        let was = known
            .map(|i| {
                let paths: BTreeSet<&str> = ctx.mt.owners_of[i]
                    .iter()
                    .map(|&o| ctx.m.owners[o].path.as_str())
                    .filter(|p| !mine.contains(p))
                    .collect();
                if paths.is_empty() {
                    String::new()
                } else {
                    format!(", captured as {}", quoted(paths))
                }
            })
            .unwrap_or_default();
        let mut f = ctx.finding(
            FindingKind::Drifted,
            s,
            &owners,
            format!(
                "the owner now holds {} at {}{was}; the graphs still read {}",
                new.layout(),
                new.data_ptr(),
                t.data_ptr()
            ),
        );
        f.live_addr = Some(new.data_ptr());
        out.push(f);
    } else if !p
        .iter()
        .any(|&o| ctx.m.owners[o].registration.is_registered())
        && let Some(f) = drifted_through(ctx, l, lt, s, &p)
    {
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
    } else if !any_kept
        && reached
        && let Some(lq) = carriers().same_view
        && let Some(why) = stale_reason(l.event.contents, t, lq)
    {
        // No path of its own holds it any more: judge the contents where it is now held.
        out.push(ctx.finding(
            FindingKind::Stale,
            s,
            &p,
            format!(
                "{why}; now held as {}",
                quoted(carriers().paths.iter().copied())
            ),
        ));
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
            // A carrier at the address holds the captured storage itself: no other owner's
            // data.
            if !any_mine
                && !others.is_empty()
                && !others.iter().any(|o| carriers().paths.contains(o))
            {
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

/// `drifted` for a subject held only through plain attributes and registered through the
/// owner of a storage that holds its bytes (`Ctx::registered_through`): when no such
/// owner holds that storage any more and one of them holds another, reloads restore the
/// new storage while the graphs read the old one.
fn drifted_through(
    ctx: &Ctx<'_>,
    l: &Live,
    lt: &Tables,
    s: &Subject<'_>,
    p: &[usize],
) -> Option<Finding> {
    let t = s.tensor;
    let through = ctx.registered_through(t);
    if through.is_empty() {
        return None;
    }
    let mut moved = None;
    for &r in &through {
        let owner = &ctx.m.owners[r];
        let Some(&lo) = lt.owner_by_path.get(&owner.path) else {
            continue;
        };
        let held = ctx.mt.tensor(&ctx.m.tensors, owner.tensor);
        let lr = lt.tensor(&l.tensors, l.owners[lo].tensor);
        if same_storage(lr, held) {
            return None;
        }
        moved.get_or_insert((owner, lr));
    }
    let (owner, lr) = moved?;
    let mut f = ctx.finding(
        FindingKind::Drifted,
        s,
        p,
        format!(
            "a view into the storage of `{}` ({}), which now holds {} at {}; reloads restore the new storage, the graphs still read {}",
            owner.path,
            owner.registration,
            lr.layout(),
            lr.data_ptr(),
            t.data_ptr()
        ),
    );
    f.live_addr = Some(lr.data_ptr());
    Some(f)
}

fn stale_reason(contents: Contents, captured: &Tensor, live: &Tensor) -> Option<&'static str> {
    let same_alg = |a: &crate::document::format::Digest, b: &crate::document::format::Digest| {
        a.algorithm() == b.algorithm()
    };
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
    use crate::document::format::{Digest, Probe, Registration};
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

    // Identity follows the storage; a view into a registered storage is registered;
    // an unused allowlist entry warns. Helpers build on the testkit manifest.

    /// `n` bytes of slot `slot`'s 256-byte storage from byte `offset`: a view of it.
    fn view(id: u32, slot: u64, offset: u64, n: u64) -> Tensor {
        let mut t = tensor(id, slot, W);
        t.offset = offset;
        t.nbytes = n;
        t.shape = vec![n / 2];
        t
    }

    /// Adds `t` (and its allocation, if new) to `m`, held at `path`, read by bs1's first
    /// node.
    fn add(m: &mut Manifest, t: Tensor, path: &str, r: Registration) {
        let slot = (t.storage_base.0 - BASE) / 0x1000;
        if !m.allocations.iter().any(|a| a.base == t.storage_base) {
            m.allocations.push(alloc(slot, W));
        }
        m.graphs[0].nodes[0]
            .touches
            .push(touch(Some(t.id.0), slot, t.offset));
        m.owners.push(owner(path, t.id.0, r));
        if !m.tensors.iter().any(|x| x.id == t.id) {
            m.tensors.push(t);
        }
    }

    /// The live snapshot equal to `m`, with an active probe at every captured address.
    fn live_of(m: &Manifest, contents: Contents) -> Live {
        let mut l = live(m, contents);
        for t in m
            .graphs
            .iter()
            .flat_map(|g| &g.nodes)
            .flat_map(|n| &n.touches)
        {
            if !l.probes.iter().any(|p| p.addr == t.addr) {
                l.probes.push(Probe {
                    addr: t.addr,
                    state: AllocState::Active,
                    pool: None,
                    allocation: None,
                });
            }
        }
        l
    }

    fn set_probe(l: &mut Live, addr: u64, state: AllocState) {
        l.probes
            .iter_mut()
            .find(|p| p.addr == Addr(addr))
            .expect("a probe at the address")
            .state = state;
    }

    fn drop_owner(l: &mut Live, path: &str) {
        let before = l.owners.len();
        l.owners.retain(|o| o.path != path);
        assert_eq!(before, l.owners.len() + 1, "{path}");
    }

    fn rebind(l: &mut Live, path: &str, t: u32) {
        l.owners.iter_mut().find(|o| o.path == path).unwrap().tensor = TensorId(t);
    }

    /// Findings naming `path` among their owners, by kind; with a live snapshot, only the
    /// live kinds (the capture-time ones are tested apart).
    fn about(r: &Report, path: &str) -> Vec<FindingKind> {
        let live = r.checked.contains(&FindingKind::Drifted);
        r.findings
            .iter()
            .filter(|f| f.owners.iter().any(|o| o.path == path))
            .filter(|f| !live || !FindingKind::CAPTURE_TIME.contains(&f.kind))
            .map(|f| f.kind)
            .collect()
    }

    /// The testkit manifest plus `model.w_half`, a plain attribute holding the second
    /// quarter of `model.w`'s storage, which bs1 reads.
    fn with_view() -> Manifest {
        let mut m = manifest();
        add(
            &mut m,
            view(5, 0, 64, 64),
            "model.w_half",
            Registration::ModuleAttribute,
        );
        m
    }

    #[test]
    fn a_view_into_a_parameter_is_registered_through_it() {
        let r = verify(&with_view(), None, &Allowlist::default()).unwrap();
        assert_eq!(about(&r, "model.w_half"), vec![], "{:?}", kinds(&r));
        // A view into a storage only plain attributes hold is still unregistered.
        let mut m = manifest();
        add(
            &mut m,
            view(5, 1, 64, 64),
            "model.scale_half",
            Registration::ObjectAttribute,
        );
        let r = verify(&m, None, &Allowlist::default()).unwrap();
        assert_eq!(
            about(&r, "model.scale_half"),
            vec![FindingKind::Unregistered]
        );
    }

    #[test]
    fn bytes_of_a_storage_outside_every_registered_view_are_unregistered() {
        // Regression (review): a parameter that is the first half of its storage, and a
        // plain attribute over the second half: an in-place reload (`param.copy_`) never
        // restores those bytes, so the storage alone does not register them.
        let mut m = manifest();
        add(
            &mut m,
            view(8, 6, 0, 128),
            "model.p",
            Registration::Parameter,
        );
        add(
            &mut m,
            view(9, 6, 128, 128),
            "model.tail",
            Registration::ModuleAttribute,
        );
        let r = verify(&m, None, &Allowlist::default()).unwrap();
        assert_eq!(about(&r, "model.tail"), vec![FindingKind::Unregistered]);
        assert_eq!(about(&r, "model.p"), vec![]);
    }

    #[test]
    fn rebinding_the_parameter_a_view_is_registered_through_is_drifted() {
        let m = with_view();
        let mut l = live_of(&m, Contents::Updated);
        // model.w is a new tensor in slot 5; the view keeps the old storage alive.
        l.allocations.push(alloc(5, W));
        let mut new = tensor(10, 5, W);
        new.id = TensorId(10);
        l.tensors.push(new);
        rebind(&mut l, "model.w", 10);
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        assert_eq!(about(&r, "model.w_half"), vec![FindingKind::Drifted]);
        let f = r
            .findings
            .iter()
            .find(|f| f.subject == "model.w_half")
            .unwrap();
        assert_eq!(f.live_addr, Some(Addr(BASE + 0x5000)));
        assert!(f.detail.contains("`model.w` (parameter)"), "{}", f.detail);
        assert!(about(&r, "model.w").contains(&FindingKind::Drifted));
    }

    #[test]
    fn a_view_dropped_while_its_base_lives_is_clean() {
        let m = with_view();
        let mut l = live_of(&m, Contents::Preserved);
        drop_owner(&mut l, "model.w_half");
        l.tensors.retain(|t| t.id != TensorId(5));
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        assert_eq!(about(&r, "model.w_half"), vec![], "{:?}", kinds(&r));

        // The base gone too, its storage freed: nothing holds those bytes any more.
        let mut l = live_of(&m, Contents::Preserved);
        drop_owner(&mut l, "model.w_half");
        drop_owner(&mut l, "model.w");
        l.tensors
            .retain(|t| t.id != TensorId(5) && t.id != TensorId(0));
        set_probe(&mut l, BASE + 64, AllocState::Free);
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        assert_eq!(
            about(&r, "model.w_half"),
            vec![FindingKind::Vanished, FindingKind::Freed]
        );
    }

    #[test]
    fn the_base_carries_only_the_bytes_its_storage_holds() {
        // A live tensor at the same base whose storage is smaller than the captured view's
        // end is not the captured storage: the view vanished and its bytes were reused.
        let m = with_view();
        let mut l = live_of(&m, Contents::Preserved);
        drop_owner(&mut l, "model.w_half");
        l.tensors.retain(|t| t.id != TensorId(5));
        let w = l.tensors.iter_mut().find(|t| t.id == TensorId(0)).unwrap();
        w.storage_nbytes = 64;
        w.nbytes = 64;
        w.shape = vec![32];
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        assert!(
            about(&r, "model.w_half").contains(&FindingKind::Vanished),
            "{:?}",
            kinds(&r)
        );
    }

    #[test]
    fn two_tensors_sharing_a_storage_one_dropped_is_clean() {
        // model.x is slot 6's whole storage, model.y the same bytes as a [2, 64] tensor.
        let mut m = manifest();
        m.allocations.push(alloc(6, W));
        m.tensors.push(tensor(6, 6, W));
        m.owners.push(owner("model.x", 6, Registration::Buffer));
        let mut y = tensor(7, 6, W);
        y.shape = vec![2, 64];
        y.stride = vec![64, 1];
        add(&mut m, y, "model.y", Registration::Buffer);
        let r = verify(&m, None, &Allowlist::default()).unwrap();
        assert_eq!(about(&r, "model.y"), vec![]);

        let mut l = live_of(&m, Contents::Preserved);
        drop_owner(&mut l, "model.y");
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        assert_eq!(about(&r, "model.y"), vec![], "{:?}", kinds(&r));

        // Both dropped and the block freed: vanished and freed.
        drop_owner(&mut l, "model.x");
        set_probe(&mut l, BASE + 0x6000, AllocState::Free);
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        assert_eq!(
            about(&r, "model.y"),
            vec![FindingKind::Vanished, FindingKind::Freed]
        );
    }

    /// `ys[i]` a plain list of slot `5 + i`'s tensors, every one read by bs1.
    fn with_list(n: u32) -> Manifest {
        let mut m = manifest();
        for i in 0..n {
            add(
                &mut m,
                tensor(5 + i, 5 + u64::from(i), W),
                &format!("model.ys[{i}]"),
                Registration::Container,
            );
        }
        m
    }

    /// `del ys[k]`: later elements shift down one index; the deleted tensor's block is free.
    fn del(m: &Manifest, n: u32, k: u32, contents: Contents) -> Live {
        let mut l = live_of(m, contents);
        for i in k..n - 1 {
            rebind(&mut l, &format!("model.ys[{i}]"), 5 + i + 1);
        }
        drop_owner(&mut l, &format!("model.ys[{}]", n - 1));
        l.tensors.retain(|t| t.id != TensorId(5 + k));
        set_probe(&mut l, BASE + (5 + u64::from(k)) * 0x1000, AllocState::Free);
        l
    }

    #[test]
    fn a_list_shifted_by_a_delete_reports_only_the_deleted_tensor() {
        for n in [3, 4] {
            let m = with_list(n);
            let l = del(&m, n, 1, Contents::Preserved);
            let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
            let k: Vec<_> = kinds(&r)
                .into_iter()
                .filter(|(k, s)| {
                    s.starts_with("model.ys") && !FindingKind::CAPTURE_TIME.contains(k)
                })
                .collect();
            // ys[1] now holds what ys[2] held; the tensor it held is gone.
            assert_eq!(
                k,
                vec![
                    (FindingKind::Drifted, "model.ys[1]".into()),
                    (FindingKind::Freed, "model.ys[1]".into()),
                ],
                "n={n}"
            );
        }
    }

    #[test]
    fn a_delete_at_the_front_shifts_every_later_element_without_a_finding() {
        // del ys[0] of four: each later element moves down one index (same displacement
        // for the tensor each path now holds and for where each captured tensor went).
        let m = with_list(4);
        let l = del(&m, 4, 0, Contents::Preserved);
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        assert_eq!(
            about(&r, "model.ys[0]"),
            vec![FindingKind::Drifted, FindingKind::Freed]
        );
        for i in 1..4 {
            assert_eq!(about(&r, &format!("model.ys[{i}]")), vec![], "ys[{i}]");
        }
    }

    #[test]
    fn swapped_list_elements_are_drifted() {
        // Regression (review): ys[0] and ys[2] swapped, every tensor still held. The model
        // now reads ys[2]'s tensor through ys[0] while the graphs read the old one: not a
        // shift (the two moved by +2 and -2), so both paths are drifted.
        let m = with_list(3);
        let mut l = live_of(&m, Contents::Preserved);
        rebind(&mut l, "model.ys[0]", 7);
        rebind(&mut l, "model.ys[2]", 5);
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        assert_eq!(about(&r, "model.ys[0]"), vec![FindingKind::Drifted]);
        assert_eq!(about(&r, "model.ys[2]"), vec![FindingKind::Drifted]);
        assert_eq!(about(&r, "model.ys[1]"), vec![]);
    }

    #[test]
    fn a_path_rebound_onto_another_captured_tensor_is_drifted() {
        // Regression (review): ys[1] = ys[0] while ys[1]'s own tensor is still held through
        // an alias captured with it (CUTLASS's c_strides2 = c_strides1 with ab_strides1
        // keeping the old one): no shift; the graphs read the old ys[1].
        let mut m = with_list(2);
        m.owners
            .push(owner("model.alias", 6, Registration::Container));
        let mut l = live_of(&m, Contents::Preserved);
        rebind(&mut l, "model.ys[1]", 5);
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        assert_eq!(about(&r, "model.ys[1]"), vec![FindingKind::Drifted]);
    }

    #[test]
    fn a_shift_whose_contents_changed_is_not_the_same_tensor() {
        // What ys[1] holds now reads other bytes than the captured ys[2]: without the
        // contents as evidence, the address is another owner's.
        let m = with_list(3);
        let mut l = del(&m, 3, 1, Contents::Preserved);
        let t = l.tensors.iter_mut().find(|t| t.id == TensorId(7)).unwrap();
        t.digest = Some(Digest("sum64:dead".into()));
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        assert_eq!(
            about(&r, "model.ys[2]"),
            vec![FindingKind::Vanished, FindingKind::Reused]
        );
    }

    #[test]
    fn a_list_shifted_by_an_insert_reports_the_new_slot_as_drifted() {
        // ys.insert(0, new): every captured tensor is still held, one index later.
        let m = with_list(2);
        let mut l = live_of(&m, Contents::Preserved);
        l.allocations.push(alloc(8, W));
        l.tensors.push(tensor(8, 8, W));
        rebind(&mut l, "model.ys[0]", 8);
        rebind(&mut l, "model.ys[1]", 5);
        l.owners
            .push(owner("model.ys[2]", 6, Registration::Container));
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        assert_eq!(about(&r, "model.ys[0]"), vec![FindingKind::Drifted]);
        assert_eq!(about(&r, "model.ys[1]"), vec![]);
    }

    #[test]
    fn a_rebound_parameter_is_drifted_while_its_old_storage_lives() {
        // model.w rebound; the old storage still held through a plain attribute graphcheck
        // did not see at capture: drifted (and the address another owner's).
        let m = manifest();
        let mut l = live_of(&m, Contents::Preserved);
        l.allocations.push(alloc(5, W));
        l.tensors.push(tensor(10, 5, W));
        rebind(&mut l, "model.w", 10);
        l.owners
            .push(owner("model.w_old", 0, Registration::ModuleAttribute));
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        assert_eq!(
            about(&r, "model.w"),
            vec![FindingKind::Drifted, FindingKind::Reused]
        );

        // Held through a view graphcheck knew at capture: the same storage, not another
        // owner's; only drifted.
        let mut m = manifest();
        m.tensors.push(view(5, 0, 0, 128));
        m.owners
            .push(owner("model.w_head", 5, Registration::ModuleAttribute));
        let mut l = live_of(&m, Contents::Preserved);
        l.allocations.push(alloc(5, W));
        l.tensors.push(tensor(10, 5, W));
        rebind(&mut l, "model.w", 10);
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        assert_eq!(about(&r, "model.w"), vec![FindingKind::Drifted]);
    }

    #[test]
    fn an_expert_reusing_a_siblings_block_is_still_reused() {
        // experts[0].s rebound to a new tensor, experts[1].s rebound into experts[0].s's
        // old block (same layout): sibling paths, but a rebinding to an unknown tensor is
        // no shift.
        let mut m = manifest();
        for i in 0..2u32 {
            add(
                &mut m,
                tensor(5 + i, 5 + u64::from(i), W),
                &format!("model.experts[{i}].s"),
                Registration::Parameter,
            );
        }
        let mut l = live_of(&m, Contents::Updated);
        l.allocations.push(alloc(8, W));
        l.tensors.push(tensor(8, 8, W));
        rebind(&mut l, "model.experts[0].s", 8);
        let mut thief = tensor(9, 5, W);
        thief.digest = Some(Digest("sum64:beef".into()));
        l.tensors.push(thief);
        rebind(&mut l, "model.experts[1].s", 9);
        l.tensors
            .retain(|t| t.id != TensorId(5) && t.id != TensorId(6));
        set_probe(&mut l, BASE + 0x6000, AllocState::Free);
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        assert_eq!(
            about(&r, "model.experts[0].s"),
            vec![FindingKind::Drifted, FindingKind::Reused]
        );
        assert_eq!(
            about(&r, "model.experts[1].s"),
            vec![FindingKind::Drifted, FindingKind::Freed]
        );
    }

    #[test]
    fn shift_siblings_differ_in_exactly_one_index() {
        assert!(shift_siblings("m.ys[2]", "m.ys[1]"));
        assert!(shift_siblings("m.experts[3].w", "m.experts[2].w"));
        assert!(!shift_siblings("m.ys[2]", "m.ys[2]"));
        assert!(!shift_siblings("m.ys[2]", "m.zs[1]"));
        assert!(!shift_siblings("m.a[0][1]", "m.a[1][0]"));
        assert!(!shift_siblings("m.d[\"a\"]", "m.d[\"b\"]"));
        assert!(!shift_siblings("m.ys[2]", "m.ys[2].w"));
        assert!(!shift_siblings("m.q.s", "m.o.s"));
    }

    #[test]
    fn an_unused_entry_warns_unless_denied() {
        let m = manifest();
        // Every capture-time finding allowed, plus an entry that allows nothing.
        let text = "[[allow]]\npath = \"model.**\"\nreason = \"x\"\n\
                    [[allow]]\nkernel = \"k*\"\nreason = \"x\"\n\
                    [[allow]]\npath = \"model.gone\"\nreason = \"old\"\n";
        let r = verify(&m, None, &Allowlist::parse(text).unwrap()).unwrap();
        assert_eq!(
            kinds(&r),
            vec![(FindingKind::UnusedAllow, "model.gone".into())]
        );
        assert_eq!(r.findings[0].severity, Severity::Warning);
        assert!(r.ok);
        assert_eq!(r.warnings().count(), 1);
        assert_eq!(r.errors().count(), 0);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["findings"][0]["severity"], "warning");
        assert_eq!(json["ok"], true);

        let deny = Allowlist::parse(text).unwrap().deny_unused(true);
        let r = verify(&m, None, &deny).unwrap();
        assert_eq!(r.findings[0].severity, Severity::Error);
        assert!(!r.ok);
        // Other findings still fail the run beside a warning.
        let r = verify(
            &m,
            None,
            &Allowlist::parse("[[allow]]\npath = \"model.gone\"\nreason = \"old\"\n").unwrap(),
        )
        .unwrap();
        assert!(!r.ok);
        assert_eq!(r.warnings().count(), 1);
    }
}
