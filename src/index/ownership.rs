//! The ownership graph of a manifest, in petgraph:
//! graph → kernel → tensor ← owner hop ← … ← root, and tensor → allocation.
//! Queries: the owner chains of a tensor, the graphs and kernels touching it, the tensors a
//! kernel pattern touches; and DOT export of the part a query concerns.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

use crate::model::ids::IdIndex;
use petgraph::Direction;
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;

use crate::model::format::{Manifest, Registration};

/// A node: small, with details in the manifest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeW {
    /// The one root every owner path hangs from.
    Root,
    /// An owner path prefix, by index into [`OwnershipGraph::hop_path`].
    Hop(u32),
    /// A manifest tensor, by index.
    Tensor(u32),
    /// A graph node that holds addresses: (graph index, node index in `graph.nodes`).
    Kernel(u32, u32),
    /// A captured graph, by index.
    Graph(u32),
    /// An allocation, by index.
    Allocation(u32),
}

/// An edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EdgeW {
    /// Parent prefix to child prefix.
    Hop,
    /// Full owner path to its tensor.
    Owns(Registration),
    /// Graph to its node.
    Contains,
    /// Node to tensor or allocation: parameter index and byte offset.
    Touch { param: u32, offset: u32 },
    /// Tensor to the allocation holding it.
    InAllocation,
}

/// See the module documentation.
pub struct OwnershipGraph<'m> {
    pub manifest: &'m Manifest,
    pub graph: StableDiGraph<NodeW, EdgeW>,
    root: NodeIndex,
    hop_paths: Vec<String>,
    /// The last hop of each hop path, as a label (`w`, `[3]`).
    hop_labels: Vec<String>,
    hops: HashMap<String, NodeIndex>,
    tensor_nodes: Vec<NodeIndex>,
    kernel_nodes: Vec<Vec<NodeIndex>>,
    graph_nodes: Vec<NodeIndex>,
    alloc_nodes: Vec<NodeIndex>,
    tensor_ix: IdIndex<crate::model::format::TensorId>,
    alloc_ix: IdIndex<crate::model::format::AllocationId>,
}

impl<'m> OwnershipGraph<'m> {
    /// Builds the graph of a checked manifest (see [`crate::index::refs::check_manifest`]).
    pub fn new(m: &'m Manifest) -> OwnershipGraph<'m> {
        let mut g = StableDiGraph::new();
        let root = g.add_node(NodeW::Root);
        let tensor_ix = IdIndex::positions(m.tensors.iter().map(|t| t.id));
        let alloc_ix = IdIndex::positions(m.allocations.iter().map(|a| a.id));
        let alloc_nodes: Vec<NodeIndex> = (0..m.allocations.len())
            .map(|i| g.add_node(NodeW::Allocation(i as u32)))
            .collect();
        let tensor_nodes: Vec<NodeIndex> = (0..m.tensors.len())
            .map(|i| {
                let n = g.add_node(NodeW::Tensor(i as u32));
                if let Some(a) = m.tensors[i].allocation.and_then(|a| alloc_ix.get(&a)) {
                    g.add_edge(n, alloc_nodes[a], EdgeW::InAllocation);
                }
                n
            })
            .collect();
        let mut this = OwnershipGraph {
            manifest: m,
            graph: g,
            root,
            hop_paths: Vec::new(),
            hop_labels: Vec::new(),
            hops: HashMap::new(),
            tensor_nodes,
            kernel_nodes: Vec::new(),
            graph_nodes: Vec::new(),
            alloc_nodes,
            tensor_ix,
            alloc_ix,
        };
        for o in &m.owners {
            let mut parent = root;
            for k in 1..=o.path.len() {
                let prefix = o.path.prefix(k);
                parent = match this.hops.get(prefix) {
                    Some(&n) => n,
                    None => {
                        let n = this.graph.add_node(NodeW::Hop(this.hop_paths.len() as u32));
                        this.hop_paths.push(prefix.to_string());
                        this.hop_labels.push(o.path.segment(k - 1).to_string());
                        this.hops.insert(prefix.to_string(), n);
                        this.graph.add_edge(parent, n, EdgeW::Hop);
                        n
                    }
                };
            }
            if let Some(t) = this.tensor_ix.get(&o.tensor) {
                let tn = this.tensor_nodes[t];
                this.graph.add_edge(parent, tn, EdgeW::Owns(o.registration));
            }
        }
        for (gi, gr) in m.graphs.iter().enumerate() {
            let gn = this.graph.add_node(NodeW::Graph(gi as u32));
            this.graph_nodes.push(gn);
            let mut ks = Vec::with_capacity(gr.nodes.len());
            for (ni, node) in gr.nodes.iter().enumerate() {
                let kn = this.graph.add_node(NodeW::Kernel(gi as u32, ni as u32));
                this.graph.add_edge(gn, kn, EdgeW::Contains);
                for t in &node.touches {
                    let target = match t.tensor.and_then(|id| this.tensor_ix.get(&id)) {
                        Some(ti) => Some(this.tensor_nodes[ti]),
                        None => t
                            .allocation
                            .and_then(|a| this.alloc_ix.get(&a))
                            .map(|a| this.alloc_nodes[a]),
                    };
                    if let Some(target) = target {
                        this.graph.add_edge(
                            kn,
                            target,
                            EdgeW::Touch {
                                param: t.param,
                                offset: t.offset,
                            },
                        );
                    }
                }
                ks.push(kn);
            }
            this.kernel_nodes.push(ks);
        }
        this
    }

    /// The index (into the manifest's `tensors`) of a tensor id.
    pub fn tensor_index(&self, id: crate::model::format::TensorId) -> Option<usize> {
        self.tensor_ix.get(&id)
    }

    /// The index (into the manifest's `allocations`) of an allocation id.
    pub fn allocation_index(&self, id: crate::model::format::AllocationId) -> Option<usize> {
        self.alloc_ix.get(&id)
    }

    /// The owner path a hop node stands for.
    pub fn hop_path(&self, hop: u32) -> &str {
        &self.hop_paths[hop as usize]
    }

    /// The last hop of an owner path this graph has (`w` of `model.w`), as a label; the
    /// path itself if the graph has no such hop.
    pub fn hop_label<'a>(&'a self, path: &'a str) -> &'a str {
        match self.hops.get(path).map(|&n| self.graph[n]) {
            Some(NodeW::Hop(h)) => &self.hop_labels[h as usize],
            _ => path,
        }
    }

    /// The node of a manifest tensor.
    pub fn tensor_node(&self, tensor: usize) -> NodeIndex {
        self.tensor_nodes[tensor]
    }

    /// Every owner chain of a tensor, root-most prefix first, and the registration of the
    /// last hop: e.g. `[model, model.layers, model.layers[0], model.layers[0].w]`.
    pub fn owner_chains(&self, tensor: usize) -> Vec<(Vec<String>, Registration)> {
        let mut out = Vec::new();
        for e in self
            .graph
            .edges_directed(self.tensor_nodes[tensor], Direction::Incoming)
        {
            let EdgeW::Owns(reg) = *e.weight() else {
                continue;
            };
            let mut chain = Vec::new();
            let mut n = e.source();
            while n != self.root {
                if let NodeW::Hop(h) = self.graph[n] {
                    chain.push(self.hop_paths[h as usize].clone());
                }
                let Some(parent) = self.graph.neighbors_directed(n, Direction::Incoming).next()
                else {
                    break;
                };
                n = parent;
            }
            chain.reverse();
            out.push((chain, reg));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The node parameter words that hold a tensor: (graph index, node index, param,
    /// offset), sorted.
    pub fn touches_of(&self, tensor: usize) -> Vec<(u32, u32, u32, u32)> {
        let mut v: Vec<_> = self
            .graph
            .edges_directed(self.tensor_nodes[tensor], Direction::Incoming)
            .filter_map(|e| match (*e.weight(), self.graph[e.source()]) {
                (EdgeW::Touch { param, offset }, NodeW::Kernel(g, n)) => {
                    Some((g, n, param, offset))
                }
                _ => None,
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// The graphs (by name, sorted) whose nodes hold a tensor.
    pub fn graphs_touching(&self, tensor: usize) -> Vec<String> {
        let set: BTreeSet<&str> = self
            .touches_of(tensor)
            .iter()
            .map(|&(g, ..)| self.manifest.graphs[g as usize].name.as_str())
            .collect();
        set.into_iter().map(String::from).collect()
    }

    /// Nodes whose name contains `pattern`: (graph index, node index).
    pub fn kernels_matching(&self, pattern: &str) -> Vec<(u32, u32)> {
        let mut v = Vec::new();
        for (gi, g) in self.manifest.graphs.iter().enumerate() {
            for (ni, n) in g.nodes.iter().enumerate() {
                if n.name.contains(pattern) {
                    v.push((gi as u32, ni as u32));
                }
            }
        }
        v
    }

    /// What a node holds: (param, offset, tensor index or allocation index).
    pub fn touched_by(&self, graph: u32, node: u32) -> Vec<(u32, u32, NodeW)> {
        let kn = self.kernel_nodes[graph as usize][node as usize];
        let mut v: Vec<_> = self
            .graph
            .edges_directed(kn, Direction::Outgoing)
            .filter_map(|e| match *e.weight() {
                EdgeW::Touch { param, offset } => Some((param, offset, self.graph[e.target()])),
                _ => None,
            })
            .collect();
        v.sort_by_key(|&(p, o, _)| (p, o));
        v
    }

    fn label(&self, n: NodeIndex) -> (String, &'static str) {
        let m = self.manifest;
        match self.graph[n] {
            NodeW::Root => ("model".into(), "house"),
            NodeW::Hop(h) => (self.hop_labels[h as usize].clone(), "box"),
            NodeW::Tensor(t) => {
                let t = &m.tensors[t as usize];
                (t.layout(), "ellipse")
            }
            NodeW::Kernel(g, k) => {
                let node = &m.graphs[g as usize].nodes[k as usize];
                let name: String = node.name.chars().take(48).collect();
                (format!("#{} {}", node.index, name), "component")
            }
            NodeW::Graph(g) => (m.graphs[g as usize].name.clone(), "folder"),
            NodeW::Allocation(a) => {
                let a = &m.allocations[a as usize];
                (format!("allocation {}+{}", a.base, a.size), "cylinder")
            }
        }
    }

    /// DOT of the nodes in `keep` and the edges among them.
    pub fn dot(&self, keep: &BTreeSet<NodeIndex>) -> String {
        let mut out =
            String::from("digraph graphcheck {\n  rankdir=LR;\n  node [fontname=\"monospace\"];\n");
        for &n in keep {
            let (label, shape) = self.label(n);
            let _ = writeln!(
                out,
                "  n{} [label=\"{}\", shape={shape}];",
                n.index(),
                dot_escape(&label)
            );
        }
        for &n in keep {
            for e in self.graph.edges_directed(n, Direction::Outgoing) {
                if !keep.contains(&e.target()) {
                    continue;
                }
                let label = match e.weight() {
                    EdgeW::Owns(r) => format!(" [label=\"{}\"]", dot_escape(&r.to_string())),
                    EdgeW::Touch { param, offset } => {
                        format!(" [label=\"param {param} +{offset}\"]")
                    }
                    _ => String::new(),
                };
                let _ = writeln!(out, "  n{} -> n{}{label};", n.index(), e.target().index());
            }
        }
        out.push_str("}\n");
        out
    }

    /// The nodes that explain a tensor: its owner chains up to the root, the nodes that
    /// touch it and their graphs, and its allocation.
    pub fn neighbourhood(&self, tensor: usize) -> BTreeSet<NodeIndex> {
        let mut keep = BTreeSet::new();
        let tn = self.tensor_nodes[tensor];
        keep.insert(tn);
        for e in self.graph.edges_directed(tn, Direction::Incoming) {
            let mut n = e.source();
            keep.insert(n);
            if let NodeW::Kernel(g, _) = self.graph[n] {
                keep.insert(self.graph_nodes[g as usize]);
                continue;
            }
            while let Some(p) = self.graph.neighbors_directed(n, Direction::Incoming).next() {
                keep.insert(p);
                n = p;
            }
        }
        for n in self.graph.neighbors_directed(tn, Direction::Outgoing) {
            keep.insert(n);
        }
        keep
    }

    /// The nodes that explain a kernel: its graph and what it touches.
    pub fn kernel_neighbourhood(&self, graph: u32, node: u32) -> BTreeSet<NodeIndex> {
        let kn = self.kernel_nodes[graph as usize][node as usize];
        let mut keep = BTreeSet::from([kn, self.graph_nodes[graph as usize]]);
        keep.extend(self.graph.neighbors_directed(kn, Direction::Outgoing));
        keep
    }

    /// The node of an allocation.
    pub fn allocation_node(&self, alloc: usize) -> NodeIndex {
        self.alloc_nodes[alloc]
    }

    /// The node of a graph node.
    pub fn kernel_node(&self, graph: u32, node: u32) -> NodeIndex {
        self.kernel_nodes[graph as usize][node as usize]
    }

    /// The node of a captured graph.
    pub fn graph_node(&self, graph: u32) -> NodeIndex {
        self.graph_nodes[graph as usize]
    }
}

/// `s` inside a DOT double-quoted string: quotes and backslashes escaped, and line breaks
/// as DOT's own `\n` (centred line) rather than raw.
fn dot_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::manifest;

    #[test]
    fn owner_chains_touches_and_kernel_queries() {
        let m = manifest();
        let og = OwnershipGraph::new(&m);
        // Tensor 1 has two owners (an alias).
        let chains = og.owner_chains(1);
        assert_eq!(chains.len(), 2);
        assert_eq!(
            chains[0].0,
            vec!["model".to_string(), "model.scale".to_string()]
        );
        assert_eq!(chains[0].1, Registration::ModuleAttribute);
        assert_eq!(og.touches_of(1), vec![(1, 0, 0, 8)]);
        assert_eq!(og.graphs_touching(1), vec!["bs8".to_string()]);
        assert_eq!(og.graphs_touching(0), vec!["bs1".to_string()]);
        assert_eq!(og.kernels_matching("k0"), vec![(0, 0), (1, 0)]);
        // Node bs1#0 holds tensor 0 and a graph-pool allocation.
        let held = og.touched_by(0, 0);
        assert_eq!(held.len(), 2);
        assert!(
            held.iter().any(|h| matches!(h.2, NodeW::Tensor(0))),
            "{held:?}"
        );
        assert!(
            held.iter().any(|h| matches!(h.2, NodeW::Allocation(3))),
            "{held:?}"
        );
    }

    #[test]
    fn dot_has_the_chain_and_the_reading_kernel() {
        let m = manifest();
        let og = OwnershipGraph::new(&m);
        let dot = og.dot(&og.neighbourhood(1));
        assert!(dot.starts_with("digraph graphcheck {"));
        for want in [
            "label=\"scale\"",
            "label=\"scale_alias\"",
            "#0 k0",
            "label=\"bs8\"",
            "module_attribute",
            "param 0 +8",
        ] {
            assert!(dot.contains(want), "missing {want}:\n{dot}");
        }
        assert!(!dot.contains("label=\"bs1\""), "{dot}");
    }
}
