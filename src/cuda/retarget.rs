//! Retargeting a captured graph in place: [`ExecPatcher`], the driver's
//! [`Patcher`](crate::plan::apply::Patcher) for one instantiated graph, and [`apply_plan`],
//! which patches one graph all or nothing (`crate::plan::apply::apply_graph`);
//! [`apply_plans`] patches many in one call.
//!
//! The plan names nodes by their manifest index, the walker's order (`walk.rs`: depth
//! first, a child graph's and a conditional's bodies numbered right after their node).
//! Only top-level nodes are patched (the plan refuses words in bodies), so the patcher
//! numbers the template's nodes as the walker does and keeps the top-level ones. A kernel
//! word is read and written where the walker read it: in its parameter's own buffer
//! (`kernelParams`), or in the packed buffer (`extra`) at its parameter's offset. A write
//! sets the node on the template (a later walk reads the new word) and on the executable
//! graph (the next replay uses it). Without the executable graph only the template
//! changes, and the caller instantiates it again before the next replay.
//!
//! The pure parts (where a word lies in a kernel's parameter bytes, the numbering) are
//! functions of plain data, tested here without a GPU.

use std::collections::HashMap;

use super::CudaError;
use super::driver::{self, ArgBytes, DriverError, GraphMut, GraphRef, KernelArgs, NodeId, NodeRef};
use super::walk::{driver_version, node_type_name};
use crate::plan::Edit;
use crate::plan::GraphPlan;
use crate::plan::apply::{Outcome, Patcher, apply_graph};

/// Where byte `offset` of a packed parameter buffer lies: (parameter, offset in it), by
/// the layout; `None` before the first parameter. The walker's mapping (`walk.rs`).
fn packed_position(layout: &[(usize, usize)], offset: usize) -> Option<(u32, u32)> {
    let i = layout.partition_point(|&(off, _)| off <= offset);
    (i > 0).then(|| ((i - 1) as u32, (offset - layout[i - 1].0) as u32))
}

/// Where the walker found the word it numbered (param, offset): (buffer, byte offset in
/// it) among the kernel's parameter bytes. Per-parameter buffers hold 8-byte words at
/// multiples of 8 from each start; a packed buffer at multiples of 8 from its start, each
/// numbered by the parameter it falls in (an offset before the first: parameter 0, the
/// byte offset as it is).
pub fn word_slot(args: &KernelArgs, param: u32, offset: u32) -> Result<(usize, usize), String> {
    let (p, o) = (param as usize, offset as usize);
    let missing = || {
        format!(
            "the kernel's parameters hold no word at param {param} +{offset} (layout of {} \
             parameters)",
            args.layout.len()
        )
    };
    match &args.bytes {
        ArgBytes::PerParam(bufs) => {
            let buf = bufs.get(p).ok_or_else(missing)?;
            if o % 8 != 0 || o + 8 > buf.len() {
                return Err(missing());
            }
            Ok((p, o))
        }
        ArgBytes::Packed(buf) => {
            let forward = |at: usize| packed_position(&args.layout, at).unwrap_or((0, at as u32));
            let candidates = [
                args.layout.get(p).map(|&(start, _)| start + o),
                (p == 0).then_some(o),
            ];
            candidates
                .into_iter()
                .flatten()
                .find(|&at| at % 8 == 0 && at + 8 <= buf.len() && forward(at) == (param, offset))
                .map(|at| (0, at))
                .ok_or_else(missing)
        }
    }
}

fn bytes_of(args: &KernelArgs, buf: usize) -> &[u8] {
    match &args.bytes {
        ArgBytes::PerParam(b) => &b[buf],
        ArgBytes::Packed(b) => b,
    }
}

/// The 8-byte word at (param, offset) of a kernel's parameter bytes.
pub fn read_word(args: &KernelArgs, param: u32, offset: u32) -> Result<u64, String> {
    let (buf, at) = word_slot(args, param, offset)?;
    let b = &bytes_of(args, buf)[at..at + 8];
    Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// Replaces the 8-byte word at (param, offset) of a kernel's parameter bytes; nothing
/// else changes.
pub fn write_word(args: &mut KernelArgs, param: u32, offset: u32, word: u64) -> Result<(), String> {
    let (buf, at) = word_slot(args, param, offset)?;
    let b = match &mut args.bytes {
        ArgBytes::PerParam(b) => &mut b[buf],
        ArgBytes::Packed(b) => b,
    };
    b[at..at + 8].copy_from_slice(&word.to_le_bytes());
    Ok(())
}

/// What the numbering asks of a graph: its nodes, their types, and their bodies; the
/// driver answers for a template, the CPU tests from a tree they build.
trait Tree: Copy {
    type Node: TreeNode<Tree = Self>;
    fn nodes(self) -> Result<Vec<Self::Node>, DriverError>;
}

trait TreeNode: Copy {
    type Tree: Tree<Node = Self>;
    fn type_number(self) -> Result<u32, DriverError>;
    fn child_graph(self) -> Result<Self::Tree, DriverError>;
    fn conditional_bodies(self) -> Result<Vec<Self::Tree>, DriverError>;
}

impl<'a> Tree for GraphRef<'a> {
    type Node = NodeRef<'a>;
    fn nodes(self) -> Result<Vec<NodeRef<'a>>, DriverError> {
        GraphRef::nodes(self)
    }
}

impl<'a> TreeNode for NodeRef<'a> {
    type Tree = GraphRef<'a>;
    fn type_number(self) -> Result<u32, DriverError> {
        NodeRef::type_number(self)
    }
    fn child_graph(self) -> Result<GraphRef<'a>, DriverError> {
        NodeRef::child_graph(self)
    }
    fn conditional_bodies(self) -> Result<Vec<GraphRef<'a>>, DriverError> {
        NodeRef::conditional_bodies(self)
    }
}

/// How many nodes the walker numbers in `g`, bodies included: a child graph's or a
/// conditional's bodies where the driver hands them out (else none, as the walker lists
/// the node unread and goes on).
fn numbered<G: Tree>(g: G) -> Result<u32, DriverError> {
    let mut n = 0;
    for node in g.nodes()? {
        n += 1 + body_nodes(node)?;
    }
    Ok(n)
}

fn body_nodes<N: TreeNode>(node: N) -> Result<u32, DriverError> {
    Ok(match node.type_number() {
        Ok(4) => match node.child_graph() {
            Ok(body) => numbered(body)?,
            Err(_) => 0,
        },
        Ok(13) => match node.conditional_bodies() {
            Ok(bodies) => {
                let mut n = 0;
                for b in bodies {
                    n += numbered(b)?;
                }
                n
            }
            Err(_) => 0,
        },
        _ => 0,
    })
}

/// The top-level nodes of `g` with the index the walker gives each, and its type (or why
/// it could not be read).
/// A node's type, or why it could not be read.
type NodeType = Result<u32, String>;

fn top_level<G: Tree>(g: G) -> Result<Vec<(u32, NodeType, G::Node)>, DriverError> {
    let mut out = Vec::new();
    let mut next = 0u32;
    for node in g.nodes()? {
        let t = node.type_number().map_err(|e| e.to_string());
        out.push((next, t, node));
        next += 1 + body_nodes(node)?;
    }
    Ok(out)
}

/// The driver's [`Patcher`] for one captured graph: its template and, where given, the
/// executable graph instantiated from it. `read` answers the word as the template holds
/// it; `write` sets the template and the executable graph.
pub struct ExecPatcher<'g> {
    g: GraphMut<'g>,
    /// Top-level nodes by manifest index: type (or why unread) and handle.
    nodes: HashMap<u32, (NodeType, NodeId)>,
}

impl<'g> ExecPatcher<'g> {
    /// Numbers the template's nodes as the walker does.
    pub fn new(g: GraphMut<'g>) -> Result<ExecPatcher<'g>, CudaError> {
        let nodes = top_level(g.read())?
            .into_iter()
            .map(|(i, t, n)| (i, (t, n.id())))
            .collect();
        Ok(ExecPatcher { g, nodes })
    }

    /// Whether writes reach the executable graph too.
    pub fn has_exec(&self) -> bool {
        self.g.has_exec()
    }

    /// The node an edit names, of the kind it says.
    fn node(&self, e: &Edit) -> Result<(u32, NodeId), String> {
        let (t, id) = self.nodes.get(&e.node).ok_or_else(|| {
            format!(
                "the graph has no top-level node {} (a node of a child-graph or conditional \
                 body, or another graph)",
                e.node
            )
        })?;
        let t = *t
            .as_ref()
            .map_err(|why| format!("node {}'s type: {why}", e.node))?;
        let kind = node_type_name(t);
        if kind != e.node_kind.as_str() {
            return Err(format!(
                "node {} is a {kind} node, the plan says {}",
                e.node, e.node_kind
            ));
        }
        Ok((t, *id))
    }
}

/// A copy end's address, `param` as the walker numbers them (0: destination, 1: source).
fn copy_end(m: &driver::MemcpyNode, param: u32) -> Option<u64> {
    match param {
        0 => m.dst.addr.map(|(a, _)| a),
        1 => m.src.addr.map(|(a, _)| a),
        _ => None,
    }
}

impl Patcher for ExecPatcher<'_> {
    fn read(&mut self, e: &Edit) -> Result<u64, String> {
        let (t, id) = self.node(e)?;
        let no_word = || {
            format!(
                "node {} has no word at param {} +{}",
                e.node, e.param, e.offset
            )
        };
        match t {
            0 => {
                let args = self.g.kernel_args(id).map_err(|x| x.to_string())?;
                read_word(&args, e.param, e.offset)
            }
            2 if (e.param, e.offset) == (0, 0) => {
                Ok(self.g.node(id).memset().map_err(|x| x.to_string())?.dst)
            }
            1 if e.offset == 0 => {
                let m = self.g.node(id).memcpy().map_err(|x| x.to_string())?;
                copy_end(&m, e.param).ok_or_else(no_word)
            }
            _ => Err(no_word()),
        }
    }

    fn write(&mut self, e: &Edit, word: u64) -> Result<(), String> {
        let (t, id) = self.node(e)?;
        match t {
            0 => {
                let mut args = self.g.kernel_args(id).map_err(|x| x.to_string())?;
                write_word(&mut args, e.param, e.offset, word)?;
                self.g.set_kernel_args(id, &args)
            }
            2 if (e.param, e.offset) == (0, 0) => self.g.set_memset_dst(id, word),
            1 if e.offset == 0 && e.param < 2 => self.g.set_memcpy_end(id, e.param, word),
            _ => {
                return Err(format!(
                    "node {} has no word at param {} +{}",
                    e.node, e.param, e.offset
                ));
            }
        }
        .map_err(|x| x.to_string())
    }
}

/// Patches one graph by its part of the plan, all or nothing: `template` is the graph's
/// `CUgraph` (torch's `raw_cuda_graph()`, `keep_graph=True`), `exec` the `CUgraphExec`
/// instantiated from it (torch's `raw_cuda_graph_exec()`). Without `exec` only the template
/// changes: the caller instantiates it again before the next replay. Needs the graph's
/// context current on this thread.
///
/// The caller promises the handles are live, and that nothing else reads, changes,
/// replays or destroys the graph during the call (`GraphMut::with_raw_handles`): no replay
/// in flight (synchronize first).
pub fn apply_plan(
    template: u64,
    exec: Option<u64>,
    plan: &GraphPlan,
) -> Result<Outcome, CudaError> {
    ready_to_patch()?;
    patch_one(template, exec, plan)
}

/// [`apply_plan`] of each graph of `graphs` (template, executable graph, its part of the
/// plan), each all or nothing, the driver and the context checked once: a retarget at
/// engine scale patches 1,667 graphs in one call. A graph whose nodes cannot be read (a
/// null handle, a driver error before any write) is refused untouched, and the graphs
/// after it are still patched: an error would lose the outcomes of those patched before.
/// The outcomes are in the order given. The caller's promise is [`apply_plan`]'s, for every
/// graph.
pub fn apply_plans(graphs: &[(u64, Option<u64>, &GraphPlan)]) -> Result<Vec<Outcome>, CudaError> {
    ready_to_patch()?;
    Ok(graphs
        .iter()
        .map(|&(template, exec, plan)| {
            patch_one(template, exec, plan).unwrap_or_else(|e| Outcome::Refused {
                why: format!("its nodes could not be read to patch: {e}"),
                restored: true,
            })
        })
        .collect())
}

/// A driver that reads parameter layouts, and a current context.
fn ready_to_patch() -> Result<(), CudaError> {
    driver_version()?;
    if !driver::has_current_context()? {
        return Err(CudaError::NoContext);
    }
    Ok(())
}

/// One graph patched, the driver ready. An error comes before any write.
fn patch_one(template: u64, exec: Option<u64>, plan: &GraphPlan) -> Result<Outcome, CudaError> {
    GraphMut::with_raw_handles(template, exec, |g| {
        let mut p = ExecPatcher::new(g)?;
        Ok(apply_graph(&mut p, plan))
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn per_param(layout: &[(usize, usize)]) -> KernelArgs {
        KernelArgs {
            layout: layout.to_vec(),
            bytes: ArgBytes::PerParam(
                layout
                    .iter()
                    .enumerate()
                    .map(|(i, &(_, s))| (0..s).map(|b| (i * 16 + b) as u8).collect())
                    .collect(),
            ),
        }
    }

    #[test]
    fn a_per_parameter_word_is_replaced_in_its_own_buffer_alone() {
        // A by-value struct of two pointers (param 0, 16 bytes), an int (param 1), a
        // pointer (param 2), as the walker numbers them.
        let layout = [(0, 16), (16, 4), (24, 8)];
        let mut a = per_param(&layout);
        let before = a.clone();
        for (p, o) in [(0, 0), (0, 8), (2, 0)] {
            let w = 0x7f00_0000_0000 + u64::from(p * 100 + o);
            write_word(&mut a, p, o, w).unwrap();
            assert_eq!(read_word(&a, p, o).unwrap(), w);
        }
        let (ArgBytes::PerParam(now), ArgBytes::PerParam(was)) = (&a.bytes, &before.bytes) else {
            unreachable!()
        };
        assert_eq!(now[1], was[1], "the int is untouched");
        assert_eq!(now[0].len(), 16);
        // No word past a parameter's end, at a misaligned offset, or in no parameter.
        for (p, o) in [(1, 0), (0, 4), (0, 16), (3, 0)] {
            assert!(write_word(&mut a, p, o, 1).is_err(), "param {p} +{o}");
        }
    }

    #[test]
    fn a_packed_word_is_found_where_the_walker_numbered_it() {
        // A packed buffer (nvjet): parameters at 0 (16 bytes), 16 (4, padded), 24 (8),
        // 32 (a 64-byte struct). The walker numbers byte 40 as (3, 8).
        let layout = [(0, 16), (16, 4), (24, 8), (32, 64)];
        let mut a = KernelArgs {
            layout: layout.to_vec(),
            bytes: ArgBytes::Packed((0..96).collect()),
        };
        assert_eq!(word_slot(&a, 3, 8).unwrap(), (0, 40));
        assert_eq!(word_slot(&a, 0, 8).unwrap(), (0, 8));
        assert_eq!(word_slot(&a, 2, 0).unwrap(), (0, 24));
        write_word(&mut a, 3, 8, 0x7f00_dead_0000).unwrap();
        let ArgBytes::Packed(b) = &a.bytes else {
            unreachable!()
        };
        assert_eq!(&b[40..48], &0x7f00_dead_0000u64.to_le_bytes());
        assert_eq!(b[39], 39);
        assert_eq!(b[48], 48);
        assert_eq!(read_word(&a, 3, 8).unwrap(), 0x7f00_dead_0000);
        // The word at 88 is the last whole one; none past the buffer's end.
        assert_eq!(word_slot(&a, 3, 56).unwrap(), (0, 88));
        assert!(word_slot(&a, 3, 64).is_err());
        assert!(word_slot(&a, 3, 4).is_err(), "misaligned");
        assert!(word_slot(&a, 5, 0).is_err());
        // A buffer with no layout: every word is parameter 0 at its byte offset.
        let b = KernelArgs {
            layout: vec![],
            bytes: ArgBytes::Packed(vec![0; 32]),
        };
        assert_eq!(word_slot(&b, 0, 24).unwrap(), (0, 24));
        assert!(word_slot(&b, 1, 0).is_err());
        // Bytes before the first parameter: parameter 0 at the byte offset.
        let c = KernelArgs {
            layout: vec![(16, 8)],
            bytes: ArgBytes::Packed(vec![0; 24]),
        };
        assert_eq!(word_slot(&c, 0, 8).unwrap(), (0, 8));
        assert_eq!(word_slot(&c, 0, 0).unwrap(), (0, 16));
    }

    #[derive(Clone, Copy)]
    struct T(&'static [F]);

    #[derive(Clone, Copy)]
    enum F {
        Leaf(u32),
        Child(T),
        LostChild,
        Conditional(&'static [T]),
        LostConditional,
        Unknown,
    }

    fn tree(nodes: Vec<F>) -> T {
        T(Box::leak(nodes.into_boxed_slice()))
    }

    fn lost(call: &'static str) -> DriverError {
        DriverError::new(call, 0, "not in this tree")
    }

    impl Tree for T {
        type Node = F;
        fn nodes(self) -> Result<Vec<F>, DriverError> {
            Ok(self.0.to_vec())
        }
    }

    impl TreeNode for F {
        type Tree = T;
        fn type_number(self) -> Result<u32, DriverError> {
            match self {
                F::Leaf(t) => Ok(t),
                F::Child(_) | F::LostChild => Ok(4),
                F::Conditional(_) | F::LostConditional => Ok(13),
                F::Unknown => Err(lost("cuGraphNodeGetType")),
            }
        }
        fn child_graph(self) -> Result<T, DriverError> {
            match self {
                F::Child(t) => Ok(t),
                _ => Err(lost("cuGraphChildGraphNodeGetGraph")),
            }
        }
        fn conditional_bodies(self) -> Result<Vec<T>, DriverError> {
            match self {
                F::Conditional(b) => Ok(b.to_vec()),
                _ => Err(lost("cuGraphNodeGetParams")),
            }
        }
    }

    fn indices(t: T) -> Vec<(u32, Option<u32>)> {
        top_level(t)
            .unwrap()
            .into_iter()
            .map(|(i, ty, _)| (i, ty.ok()))
            .collect()
    }

    #[test]
    fn top_level_nodes_get_the_walkers_indices_past_every_body() {
        // walk.rs's tree: 0 alloc, 1 child { 2 alloc, 3 child { 4 memset }, 5 free },
        // 6 memset, 7 event.
        let inner = tree(vec![F::Leaf(2)]);
        let body = tree(vec![F::Leaf(10), F::Child(inner), F::Leaf(11)]);
        let top = tree(vec![F::Leaf(10), F::Child(body), F::Leaf(2), F::Leaf(6)]);
        assert_eq!(
            indices(top),
            [(0, Some(10)), (1, Some(4)), (6, Some(2)), (7, Some(6))]
        );
        assert_eq!(numbered(top).unwrap(), 8);
        // A conditional's bodies are numbered under it (walk.rs: 0, 1 { 2 | 3, 4 }, 5).
        let then = tree(vec![F::Leaf(2)]);
        let other = tree(vec![F::Leaf(2), F::Leaf(2)]);
        let top = tree(vec![
            F::Leaf(10),
            F::Conditional(Box::leak(vec![then, other].into_boxed_slice())),
            F::Leaf(2),
        ]);
        assert_eq!(indices(top), [(0, Some(10)), (1, Some(13)), (5, Some(2))]);
        // Bodies the driver does not hand out, and a node of unknown type, number no
        // more than themselves (walk.rs lists them unread).
        let top = tree(vec![
            F::LostConditional,
            F::LostChild,
            F::Unknown,
            F::Leaf(0),
        ]);
        assert_eq!(
            indices(top),
            [(0, Some(13)), (1, Some(4)), (2, None), (3, Some(0))]
        );
    }
}
