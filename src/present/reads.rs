//! The reads view of a manifest: its owners, pools and, per graph, the owner paths it
//! reads, the reads no owner explains and its kernels, as sorted plain text with no
//! address, id, pool number, size, timing or producer fact, so that an engine's own tests
//! can store it as a snapshot (`graphcheck.reads`, the syrupy extension) and review a
//! change of what its graphs read as a diff. What it leaves out, and why, is in
//! `docs/recipes/pytest.md`. Text from documents goes through [`escape`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use crate::model::format::{
    AllocationId, Document, Graph, IgnoredReason, Manifest, NodeKind, Owner, PoolId, PoolKind,
    Tensor, TensorId,
};
use crate::present::fmt::escape;

/// What the view shows beyond what it always shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadsOptions {
    /// Kernel names (per graph: its nodes, and which kernel holds each read no owner
    /// explains). They differ between GPU architectures and library versions (cuBLAS,
    /// CUTLASS and Triton pick other kernels, and other numbers of them), so a snapshot
    /// shared by machines leaves them out.
    pub kernels: bool,
}

impl Default for ReadsOptions {
    fn default() -> ReadsOptions {
        ReadsOptions { kernels: true }
    }
}

/// Why a document has no reads view.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReadsError {
    #[error(
        "the reads view is of a manifest (the document written at capture), not of a live \
         snapshot, which holds no graphs"
    )]
    LiveSnapshot,
}

/// The version of the view's text, in its first line: a snapshot that changes because
/// graphcheck printed it otherwise says so there.
const VIEW_VERSION: u32 = 1;

/// The reads view of a manifest ([`reads_manifest`]); a live snapshot is an error.
pub fn reads(d: &Document, options: ReadsOptions) -> Result<String, ReadsError> {
    match d {
        Document::Manifest(m) => Ok(reads_manifest(m, options)),
        Document::Live(_) => Err(ReadsError::LiveSnapshot),
    }
}

/// The reads view of a manifest: equal for two recordings of the same model and graphs,
/// wherever their tensors lay, in whatever order and with whatever ids they were written.
pub fn reads_manifest(m: &Manifest, options: ReadsOptions) -> String {
    let view = View::new(m, options);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "graphcheck reads v{VIEW_VERSION} (kernels {})",
        if options.kernels { "shown" } else { "left out" }
    );
    let mut pools: Vec<String> = m
        .pools
        .iter()
        .map(|p| {
            let mut line = format!(
                "  {}: {}, sleep {}",
                view.pools.label(p.id),
                p.kind,
                p.sleep
            );
            if p.kind == PoolKind::Graph {
                let n = view.pools.graphs_of.get(&p.id).map_or(0, Vec::len) as u64;
                let _ = write!(line, ", {n} graph{}", plural(n));
            }
            line + "\n"
        })
        .collect();
    pools.sort();
    section(&mut out, "pools", pools);
    let mut owners: Vec<String> = m
        .owners
        .iter()
        .filter_map(|o| {
            let t = view.tensors.get(&o.tensor)?;
            let dims: Vec<String> = t.shape.iter().map(u64::to_string).collect();
            Some(format!(
                "  {}: {}, {}[{}], {}\n",
                escape(&o.path),
                registration(o),
                escape(&t.dtype),
                dims.join(", "),
                match t.pool {
                    Some(p) => format!("pool {}", view.pools.label(p)),
                    None => "no pool".to_string(),
                }
            ))
        })
        .collect();
    owners.sort();
    section(&mut out, "owners", owners);
    // By name, then by text: two graphs of one name (a graph recorded again) keep one order
    // whatever order the manifest lists them in.
    let mut graphs: Vec<(&str, String)> = m
        .graphs
        .iter()
        .map(|g| (g.name.as_str(), view.graph(g)))
        .collect();
    graphs.sort();
    section(
        &mut out,
        "graphs",
        graphs.into_iter().map(|(_, text)| text).collect(),
    );
    out
}

/// `name:` and its lines, in order, or `name: none`.
fn section(out: &mut String, name: &str, lines: Vec<String>) {
    if lines.is_empty() {
        let _ = writeln!(out, "{name}: none");
        return;
    }
    let _ = writeln!(out, "{name}:");
    lines.iter().for_each(|l| out.push_str(l));
}

/// What the graphs' sections look up, built once per manifest (an engine records
/// thousands of graphs).
struct View<'m> {
    options: ReadsOptions,
    pools: PoolLabels,
    tensors: HashMap<TensorId, &'m Tensor>,
    owners_of: HashMap<TensorId, Vec<&'m Owner>>,
    allocation_pool: HashMap<AllocationId, Option<PoolId>>,
}

impl<'m> View<'m> {
    fn new(m: &'m Manifest, options: ReadsOptions) -> View<'m> {
        let mut owners_of: HashMap<TensorId, Vec<&Owner>> = HashMap::new();
        for o in &m.owners {
            owners_of.entry(o.tensor).or_default().push(o);
        }
        View {
            options,
            pools: PoolLabels::new(m),
            tensors: m.tensors.iter().map(|t| (t.id, t)).collect(),
            owners_of,
            allocation_pool: m.allocations.iter().map(|a| (a.id, a.pool)).collect(),
        }
    }

    /// One graph's section: its pool, the owner paths it reads, what no owner explains,
    /// its nodes. Word counts are shown only with the kernels: they count kernels'
    /// parameter words, which change with the kernels.
    fn graph(&self, g: &Graph) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "  {}{}:",
            escape(&g.name),
            match g.pool {
                Some(p) => format!(" (pool {})", self.pools.label(p)),
                None => String::new(),
            }
        );
        let mut read: BTreeSet<String> = BTreeSet::new();
        // Where a read no owner explains lies, and the node holding it: words counted.
        let mut unexplained: BTreeMap<(String, String), u64> = BTreeMap::new();
        let mut intermediates = 0u64;
        let mut outside: BTreeMap<&'static str, u64> = BTreeMap::new();
        let mut nodes: BTreeMap<String, u64> = BTreeMap::new();
        let mut opaque = 0u64;
        for n in &g.nodes {
            let node = node_name(n.kind, &n.name);
            for t in &n.touches {
                let tensor = t.tensor.and_then(|id| self.tensors.get(&id));
                match t.tensor.and_then(|id| self.owners_of.get(&id)) {
                    Some(os) if !os.is_empty() => {
                        for o in os {
                            read.insert(format!("{} ({})", escape(&o.path), o.registration));
                        }
                    }
                    _ => {
                        let allocation = t.allocation.or(tensor.and_then(|t| t.allocation));
                        let pool = tensor.and_then(|t| t.pool).or_else(|| {
                            allocation.and_then(|a| self.allocation_pool.get(&a).copied().flatten())
                        });
                        // What verify leaves out too: a graph's intermediates, in its pool.
                        if pool.is_some_and(|p| self.pools.kind(p) == Some(PoolKind::Graph)) {
                            intermediates += 1;
                            continue;
                        }
                        let place = match (pool, allocation.is_some() || tensor.is_some()) {
                            (Some(p), _) => format!(
                                "in pool kind {}",
                                self.pools
                                    .kind(p)
                                    .map_or_else(|| "?".to_string(), |k| k.to_string())
                            ),
                            (None, true) => "in no declared pool".to_string(),
                            (None, false) => "outside every known allocation".to_string(),
                        };
                        *unexplained.entry((place, node.clone())).or_default() += 1;
                    }
                }
            }
            for w in &n.ignored {
                // Index slots and words into free memory are stale bytes, which differ from
                // run to run; the RNG state and NCCL's communicator are owners outside the
                // model.
                let known = match w.reason {
                    IgnoredReason::RngState => "torch's RNG state",
                    IgnoredReason::NcclComm => "NCCL's communicator",
                    IgnoredReason::IndexSlot | IgnoredReason::FreeMemory => continue,
                };
                *outside.entry(known).or_default() += 1;
            }
            if n.opaque.is_some() {
                opaque += 1;
            }
            let suffix = if n.opaque.is_some() { " (opaque)" } else { "" };
            *nodes.entry(format!("{node}{suffix}")).or_default() += 1;
        }
        let kernels = self.options.kernels;
        let words = |n: u64| {
            if kernels {
                format!(": {n} word{}", plural(n))
            } else {
                String::new()
            }
        };
        let nothing = read.is_empty() && outside.is_empty();
        out.push_str(if nothing {
            "    reads: nothing\n"
        } else {
            "    reads:\n"
        });
        for r in &read {
            let _ = writeln!(out, "      {r}");
        }
        for (what, n) in &outside {
            let _ = writeln!(out, "      {what}{}", words(*n));
        }
        if !unexplained.is_empty() {
            out.push_str("    reads no owner explains:\n");
            if kernels {
                for ((place, by), n) in &unexplained {
                    let _ = writeln!(out, "      {place}{} by {by}", words(*n));
                }
            } else {
                let places: BTreeSet<&String> = unexplained.keys().map(|(p, _)| p).collect();
                for place in places {
                    let _ = writeln!(out, "      {place}");
                }
            }
        }
        if kernels {
            if intermediates > 0 {
                let _ = writeln!(
                    out,
                    "    intermediates in graph pools{}",
                    words(intermediates)
                );
            }
            out.push_str(if nodes.is_empty() {
                "    nodes: none\n"
            } else {
                "    nodes:\n"
            });
            for (name, n) in &nodes {
                let _ = writeln!(out, "      {n} x {name}");
            }
        } else if opaque > 0 {
            // Opaque nodes leave reads unseen: said even where their names are left out.
            let _ = writeln!(out, "    opaque: {opaque} node{}", plural(opaque));
        }
        let mut unread: BTreeMap<String, u64> = BTreeMap::new();
        for u in &g.unread {
            *unread.entry(escape(&u.node_type).into_owned()).or_default() += 1;
        }
        if !unread.is_empty() {
            let counts: Vec<String> = unread.iter().map(|(k, n)| format!("{n} {k}")).collect();
            let _ = writeln!(out, "    unread: {}", counts.join(", "));
        }
        out
    }
}

/// Pools as the view names them: by their name, except a graph's private pool, which torch
/// numbers in the order pools were made in the process (`graph(1, 0)`): it is named by the
/// first graph, by name, that it holds (`graph pool of decode_bs1`).
struct PoolLabels {
    labels: HashMap<PoolId, String>,
    kinds: HashMap<PoolId, PoolKind>,
    graphs_of: HashMap<PoolId, Vec<String>>,
}

impl PoolLabels {
    fn new(m: &Manifest) -> PoolLabels {
        let mut graphs_of: HashMap<PoolId, Vec<String>> = HashMap::new();
        for g in &m.graphs {
            if let Some(p) = g.pool {
                graphs_of.entry(p).or_default().push(g.name.clone());
            }
        }
        graphs_of.values_mut().for_each(|v| v.sort());
        let labels = m
            .pools
            .iter()
            .map(|p| {
                let label = if p.kind == PoolKind::Graph {
                    match graphs_of.get(&p.id).and_then(|v| v.first()) {
                        Some(g) => format!("graph pool of {}", escape(g)),
                        None => "graph pool of no graph".to_string(),
                    }
                } else {
                    escape(&p.name).into_owned()
                };
                (p.id, label)
            })
            .collect();
        PoolLabels {
            labels,
            kinds: m.pools.iter().map(|p| (p.id, p.kind)).collect(),
            graphs_of,
        }
    }

    /// A pool the manifest does not declare cannot be named; the loader refuses such
    /// documents, so `?` is only ever a hand-built manifest's.
    fn label(&self, p: PoolId) -> &str {
        self.labels.get(&p).map_or("?", String::as_str)
    }

    fn kind(&self, p: PoolId) -> Option<PoolKind> {
        self.kinds.get(&p).copied()
    }
}

/// `parameter`, or `object_attribute on MarlinLinearKernel` where the holder is known.
fn registration(o: &Owner) -> String {
    match &o.holder {
        Some(h) => format!("{} on {}", o.registration, escape(h)),
        None => o.registration.to_string(),
    }
}

/// `kernel void foo<…>`; a memset or memcpy by its name alone, which starts with its kind
/// (`memcpy unified->unified (16384 bytes)`).
fn node_name(kind: NodeKind, name: &str) -> String {
    let kind = kind.to_string();
    if name.starts_with(&kind) {
        escape(name).into_owned()
    } else if name.is_empty() {
        kind
    } else {
        format!("{kind} {}", escape(name))
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::load::load_document;
    use crate::model::format::{Addr, AllocationId, Live, Producer};
    use crate::testkit;
    use std::path::{Path, PathBuf};

    fn root() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    fn manifest_at(rel: &str) -> Manifest {
        match load_document(&root().join(rel)) {
            Ok(Document::Manifest(m)) => m,
            other => panic!("{rel}: not a manifest: {other:?}"),
        }
    }

    /// Every committed manifest: the synthetic scenarios' and the GPU recordings'.
    fn every_fixture_manifest() -> Vec<String> {
        let mut out = Vec::new();
        for dir in ["fixtures/synthetic", "fixtures/gpu"] {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            entries.sort();
            for p in entries {
                let candidate = if p.is_dir() {
                    p.join("manifest.json")
                } else {
                    p.clone()
                };
                let rel = candidate.strip_prefix(root()).unwrap().to_string_lossy();
                if candidate.is_file()
                    && candidate.extension().is_some_and(|e| e == "json")
                    && matches!(load_document(&candidate), Ok(Document::Manifest(_)))
                {
                    out.push(rel.into_owned());
                }
            }
        }
        out
    }

    /// The same recording as another run makes it: every address moved by `shift`, every
    /// id numbered otherwise, the records in another order, graph pools numbered by torch
    /// otherwise, another producer.
    fn elsewhere(m: &Manifest, shift: u64) -> Manifest {
        let mut m = m.clone();
        let mv = |a: &mut Addr| a.0 = a.0.wrapping_add(shift);
        let n_t = m.tensors.len() as u32;
        let n_a = m.allocations.len() as u32;
        let n_p = m.pools.len() as u32;
        let t_id = |id: &mut TensorId| id.0 = n_t - 1 - id.0;
        let a_id = |id: &mut AllocationId| id.0 = n_a - 1 - id.0;
        let p_id = |id: &mut PoolId| id.0 = n_p - 1 - id.0;
        for a in &mut m.allocations {
            mv(&mut a.base);
            a_id(&mut a.id);
            a.pool.iter_mut().for_each(p_id);
        }
        for t in &mut m.tensors {
            mv(&mut t.storage_base);
            t_id(&mut t.id);
            t.allocation.iter_mut().for_each(a_id);
            t.pool.iter_mut().for_each(p_id);
        }
        for o in &mut m.owners {
            t_id(&mut o.tensor);
        }
        for (i, p) in m.pools.iter_mut().enumerate() {
            p_id(&mut p.id);
            if p.kind == PoolKind::Graph {
                p.name = format!("graph({}, {})", 40 + i, 3);
            }
        }
        for g in &mut m.graphs {
            g.pool.iter_mut().for_each(p_id);
            for gu in &mut g.guards {
                mv(&mut gu.addr);
            }
            for n in &mut g.nodes {
                for t in &mut n.touches {
                    mv(&mut t.addr);
                    t.tensor.iter_mut().for_each(t_id);
                    t.allocation.iter_mut().for_each(a_id);
                }
                for w in &mut n.ignored {
                    mv(&mut w.addr);
                }
                n.touches.reverse();
            }
            g.nodes.reverse();
        }
        for r in &mut m.ranges {
            mv(&mut r.addr);
        }
        m.tensors.reverse();
        m.allocations.reverse();
        m.owners.reverse();
        m.pools.reverse();
        m.graphs.reverse();
        m.producer = Producer {
            tool: "another".into(),
            tool_version: "9.9".into(),
            gpu: Some("another GPU".into()),
            driver_version: Some(99999),
            framework: Some("torch 9".into()),
            rank: m.producer.rank,
            world_size: m.producer.world_size,
            session: None,
        };
        m
    }

    #[test]
    fn a_recording_at_other_addresses_with_other_ids_gives_the_same_text() {
        let fixtures = every_fixture_manifest();
        assert!(fixtures.len() > 40, "{fixtures:?}");
        for rel in fixtures {
            let m = manifest_at(&rel);
            for kernels in [true, false] {
                let o = ReadsOptions { kernels };
                let text = reads_manifest(&m, o);
                let moved = elsewhere(&m, 0x0000_1230_0000_0000);
                assert_ne!(m.allocations.first().map(|a| a.base), Some(Addr(0)));
                assert_eq!(text, reads_manifest(&moved, o), "{rel}, kernels {kernels}");
                assert!(!text.contains("0x"), "{rel}: an address in\n{text}");
            }
        }
    }

    #[test]
    fn the_text_holds_no_address_id_pool_number_or_producer_fact() {
        for rel in every_fixture_manifest() {
            let m = manifest_at(&rel);
            let text = reads_manifest(&m, ReadsOptions::default());
            for p in &m.pools {
                if p.kind == PoolKind::Graph {
                    assert!(!text.contains(&p.name), "{rel}: pool {} in\n{text}", p.name);
                }
            }
            for fact in [&m.producer.tool_version, &m.producer.tool] {
                assert!(!text.contains(fact.as_str()), "{rel}: {fact} in\n{text}");
            }
            for line in text.lines() {
                assert!(!line.chars().any(char::is_control), "{rel}: {line:?}");
            }
        }
    }

    #[test]
    fn a_live_snapshot_is_an_error() {
        let m = testkit::manifest();
        let l: Live = testkit::live(&m, crate::model::format::Contents::Preserved);
        assert_eq!(
            reads(&Document::Live(l), ReadsOptions::default()),
            Err(ReadsError::LiveSnapshot)
        );
        assert!(reads(&Document::Manifest(m), ReadsOptions::default()).is_ok());
    }

    #[test]
    fn a_graph_reading_one_more_unregistered_tensor_adds_its_owner_path() {
        let m = testkit::manifest();
        let before = reads_manifest(&m, ReadsOptions::default());
        let mut after = m.clone();
        let mut t = testkit::tensor(9, 5, testkit::W);
        t.shape = vec![16];
        after.tensors.push(t);
        after.allocations.push(testkit::alloc(5, testkit::W));
        after.owners.push(testkit::owner(
            "model.rope_cache",
            9,
            crate::model::format::Registration::ModuleAttribute,
        ));
        after.graphs[0].nodes[1]
            .touches
            .push(testkit::touch(Some(9), 5, 0));
        let after = reads_manifest(&after, ReadsOptions::default());
        let added: Vec<&str> = after
            .lines()
            .filter(|l| !before.lines().any(|b| b == *l))
            .collect();
        assert_eq!(
            added,
            [
                "  model.rope_cache: module_attribute, bfloat16[16], pool weights",
                "      model.rope_cache (module_attribute)",
            ],
            "{after}"
        );
    }

    #[test]
    fn without_kernels_no_node_name_is_printed() {
        let m = manifest_at("fixtures/gpu/corpus_marlin_manifest.json");
        let text = reads_manifest(&m, ReadsOptions { kernels: false });
        assert!(
            text.starts_with("graphcheck reads v1 (kernels left out)\n"),
            "{text}"
        );
        for n in m.graphs.iter().flat_map(|g| &g.nodes) {
            if n.name.len() > 8 {
                assert!(!text.contains(&*n.name), "{} in\n{text}", n.name);
            }
        }
    }

    #[test]
    fn a_graph_retargeted_to_its_owners_new_tensors_reads_what_it_read() {
        // Real pairs at other addresses: each GPU recording's manifest, and the manifest
        // after retarget moved the graph's words to the tensors the same paths hold now.
        for name in [
            "cutlass_strides",
            "marlin_workspace",
            "memcpy_device",
            "mla_w_uv",
            "rebind_chain",
            "rebound_parameter",
            "triton",
        ] {
            let before = manifest_at(&format!("fixtures/gpu/retarget_{name}_manifest.json"));
            let after = manifest_at(&format!("fixtures/gpu/retarget_{name}_after.json"));
            let words = |m: &Manifest| -> BTreeSet<u64> {
                m.graphs
                    .iter()
                    .flat_map(|g| &g.nodes)
                    .flat_map(|n| &n.touches)
                    .map(|t| t.addr.0)
                    .collect()
            };
            assert_ne!(words(&before), words(&after), "{name}: nothing moved");
            let o = ReadsOptions::default();
            assert_eq!(
                reads_manifest(&before, o),
                reads_manifest(&after, o),
                "{name}"
            );
        }
    }

    fn settings(name: &str, input: &Path) -> insta::Settings {
        let mut s = insta::Settings::clone_current();
        s.set_snapshot_path(root().join("snapshots"));
        s.set_prepend_module_to_snapshot(false);
        s.set_input_file(input);
        s.set_snapshot_suffix(name.to_string());
        s
    }

    #[test]
    fn the_view_of_some_fixtures() {
        for (name, rel, kernels) in [
            (
                "marlin_workspace_rebuilt",
                "fixtures/synthetic/marlin_workspace_rebuilt/manifest.json",
                true,
            ),
            (
                "module_global_cache",
                "fixtures/synthetic/module_global_cache/manifest.json",
                true,
            ),
            (
                "gpu_corpus_marlin",
                "fixtures/gpu/corpus_marlin_manifest.json",
                true,
            ),
            (
                "gpu_corpus_marlin_no_kernels",
                "fixtures/gpu/corpus_marlin_manifest.json",
                false,
            ),
            (
                "gpu_rng_capture",
                "fixtures/gpu/rng_capture_manifest.json",
                true,
            ),
            (
                "gpu_sleep_mispooled",
                "fixtures/gpu/sleep_mispooled_manifest.json",
                true,
            ),
            (
                "gpu_engine_tree_superseded",
                "fixtures/gpu/engine_tree_superseded_manifest.json",
                true,
            ),
            (
                "gpu_nodes_nccl",
                "fixtures/gpu/nodes_nccl_manifest.json",
                true,
            ),
        ] {
            let path = root().join(rel);
            let text = reads_manifest(&manifest_at(rel), ReadsOptions { kernels });
            settings(name, &path).bind(|| insta::assert_snapshot!("reads", text));
        }
    }
}
