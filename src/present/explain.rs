//! Explain: trace an address, an owner path or a kernel through the ownership graph, as
//! text or DOT.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::index::address::AddressIndex;
use crate::index::ownership::{NodeW, OwnershipGraph};
use crate::model::format::{Addr, Manifest};
use crate::present::fmt::{AddrFmt, escape_lines};

/// What to explain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Query {
    /// A device address (`0x…`).
    Address(Addr),
    /// An owner path.
    Owner(String),
    /// Nodes whose name contains this text.
    Kernel(String),
}

impl Query {
    /// An explain target: `0x` and hexadecimal digits is an address; anything else an owner
    /// path. A target that starts like an address but is not one is an error, never an
    /// owner path: no owner path starts with `0x`, so it could only match nothing; so is
    /// an owner path the grammar refuses (`model..x`, `model.layers[0`).
    pub fn parse(s: &str) -> Result<Query, QueryError> {
        let t = s.trim();
        if t.is_empty() {
            return Err(QueryError::Empty);
        }
        let bad = |why: String| QueryError::Address {
            target: t.to_string(),
            why,
        };
        if let Some(hex) = t.strip_prefix("0X") {
            return Err(bad(format!(
                "write the prefix as a lowercase `0x` (0x{hex})"
            )));
        }
        let Some(hex) = t.strip_prefix("0x") else {
            // A malformed owner path could only match nothing: it is the caller's mistake.
            return match crate::model::owner_path::OwnerPath::parse(s) {
                Ok(_) => Ok(Query::Owner(s.to_string())),
                Err(e) => Err(QueryError::OwnerPath {
                    target: s.to_string(),
                    at: e.at,
                    why: e.why,
                }),
            };
        };
        if hex.is_empty() {
            return Err(bad("no hexadecimal digits follow `0x`".into()));
        }
        if let Some(c) = hex.chars().find(|c| !c.is_ascii_hexdigit()) {
            return Err(bad(format!("{c:?} is not a hexadecimal digit")));
        }
        if hex.len() > 16 {
            return Err(bad(format!(
                "{} hexadecimal digits, but an address has at most 16",
                hex.len()
            )));
        }
        let a = u64::from_str_radix(hex, 16).expect("1 to 16 hexadecimal digits fit in a u64");
        Ok(Query::Address(Addr(a)))
    }

    /// Every node whose name contains `pattern`; an empty pattern is an error, since it
    /// would match every node.
    pub fn kernel(pattern: &str) -> Result<Query, QueryError> {
        if pattern.is_empty() {
            Err(QueryError::EmptyKernel)
        } else {
            Ok(Query::Kernel(pattern.to_string()))
        }
    }
}

/// Why a string is not something to explain.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    #[error("the target is empty: give an address (0x…), an owner path, or --kernel PATTERN")]
    Empty,
    #[error("`{target}` is not an address: {why}")]
    Address { target: String, why: String },
    #[error("`{target}` is not an owner path: {why} (at byte {at})")]
    OwnerPath {
        target: String,
        at: usize,
        why: &'static str,
    },
    #[error("the kernel pattern is empty, which would match every node")]
    EmptyKernel,
}

/// The result: text for people, DOT for graphviz; `found` is false when nothing matched.
#[derive(Clone, Debug)]
pub struct Explanation {
    pub found: bool,
    pub text: String,
    pub dot: String,
}

/// Explains `q` in a checked manifest.
pub fn explain(m: &Manifest, q: &Query, fmt: &dyn AddrFmt) -> Explanation {
    let og = OwnershipGraph::new(m);
    let mut text = String::new();
    let mut keep = BTreeSet::new();
    let found = match q {
        Query::Address(a) => {
            let idx = AddressIndex::new(&m.tensors, &m.allocations);
            let _ = writeln!(text, "address {}", fmt.addr(*a));
            let allocs = idx.allocations_at(*a);
            for &ai in &allocs {
                let al = &m.allocations[ai];
                let _ = writeln!(
                    text,
                    "  in allocation {}+{} ({} bytes in){}",
                    fmt.addr(al.base),
                    al.size,
                    a.0 - al.base.0,
                    pool_suffix(m, al.pool)
                );
                keep.insert(og.allocation_node(ai));
            }
            let views = idx.views_at(*a);
            let storages: BTreeSet<u32> = views
                .iter()
                .filter_map(|&ti| m.tensors[ti].storage)
                .collect();
            if storages.len() > 1 {
                let _ = writeln!(
                    text,
                    "  {} storages held this address, one after another: each graph reads the one alive at its capture",
                    storages.len()
                );
            }
            for &ti in &views {
                text.push('\n');
                tensor_text(&og, ti, fmt, &mut text);
                keep.extend(og.neighbourhood(ti));
            }
            // Nodes that hold this address without naming a tensor.
            let mut bare = Vec::new();
            for (gi, g) in m.graphs.iter().enumerate() {
                for (ni, n) in g.nodes.iter().enumerate() {
                    for t in &n.touches {
                        if t.tensor.is_none()
                            && (t.addr == *a
                                || allocs
                                    .iter()
                                    .any(|&ai| t.allocation == Some(m.allocations[ai].id)))
                        {
                            bare.push(format!(
                                "    {}#{} {} param {} +{} holds {}",
                                g.name,
                                n.index,
                                crate::present::fmt::shorten(&n.name, 120),
                                t.param,
                                t.offset,
                                fmt.addr(t.addr)
                            ));
                            keep.insert(og.kernel_node(gi as u32, ni as u32));
                            keep.insert(og.graph_node(gi as u32));
                        }
                    }
                }
            }
            if !bare.is_empty() {
                let _ = writeln!(
                    text,
                    "\n  held without a tensor by {} node parameter(s):",
                    bare.len()
                );
                for b in bare {
                    text.push_str(&b);
                    text.push('\n');
                }
            }
            if views.is_empty() && allocs.is_empty() {
                text.push_str("  in no allocation or tensor of the manifest\n");
            }
            !views.is_empty() || !allocs.is_empty()
        }
        Query::Owner(p) => match m.owners.iter().find(|o| &o.path == p) {
            Some(o) => {
                let held: Vec<&crate::model::format::Owner> =
                    m.owners.iter().filter(|x| &x.path == p).collect();
                let _ = writeln!(text, "owner {p} ({})", o.registration);
                if held.len() > 1 {
                    let _ = writeln!(
                        text,
                        "  held {} storages at different captures (rebound between them); the first is what it held at the last walk",
                        held.len()
                    );
                }
                for (k, o) in held.into_iter().enumerate() {
                    if k > 0 {
                        text.push('\n');
                    }
                    let ti = m
                        .tensors
                        .iter()
                        .position(|t| t.id == o.tensor)
                        .expect("checked manifest");
                    let t = &m.tensors[ti];
                    match t
                        .allocation
                        .and_then(|a| og.allocation_index(a))
                        .map(|ai| &m.allocations[ai])
                    {
                        Some(al) => {
                            let _ = writeln!(
                                text,
                                "  in allocation {}+{} ({} bytes in){}",
                                fmt.addr(al.base),
                                al.size,
                                t.data_ptr().0 - al.base.0,
                                pool_suffix(m, al.pool)
                            );
                        }
                        None => text.push_str("  in no allocation of the manifest\n"),
                    }
                    tensor_text(&og, ti, fmt, &mut text);
                    keep.extend(og.neighbourhood(ti));
                }
                true
            }
            None => {
                let _ = writeln!(text, "owner {p}: no such owner path in the manifest");
                let near: Vec<&str> = m
                    .owners
                    .iter()
                    .map(|o| o.path.as_str())
                    .filter(|x| x.starts_with(p.as_str()) || p.starts_with(*x))
                    .take(5)
                    .collect();
                if !near.is_empty() {
                    let _ = writeln!(text, "  paths sharing a prefix: {}", near.join(", "));
                }
                false
            }
        },
        Query::Kernel(pat) => {
            let hits = og.kernels_matching(pat);
            let _ = writeln!(text, "kernels matching {pat:?}: {}", hits.len());
            for &(g, n) in &hits {
                let graph = &m.graphs[g as usize];
                let node = &graph.nodes[n as usize];
                let _ = write!(
                    text,
                    "\n{}#{} {} {}",
                    graph.name, node.index, node.kind, node.name
                );
                if let (Some(gr), Some(bl)) = (node.grid, node.block) {
                    let _ = write!(text, " grid {gr:?} block {bl:?}");
                }
                text.push('\n');
                if let Some(why) = &node.opaque {
                    let _ = writeln!(text, "  opaque: {why}");
                }
                for t in &node.touches {
                    let _ = writeln!(
                        text,
                        "  param {} +{}: {} -> {}",
                        t.param,
                        t.offset,
                        fmt.addr(t.addr),
                        touch_target(m, &og, t)
                    );
                }
                keep.extend(og.kernel_neighbourhood(g, n));
                for (_, _, w) in og.touched_by(g, n) {
                    if let NodeW::Tensor(ti) = w {
                        keep.extend(og.neighbourhood(ti as usize).into_iter().filter(|&x| {
                            !matches!(og.graph[x], NodeW::Kernel(..) | NodeW::Graph(_))
                        }));
                    }
                }
            }
            !hits.is_empty()
        }
    };
    // Names, paths and kernel names come from the document: nothing in them reaches the
    // terminal as a control character.
    let dot = escape_lines(og.dot(&keep));
    let text = escape_lines(text);
    Explanation { found, text, dot }
}

fn pool_suffix(m: &Manifest, pool: Option<crate::model::format::PoolId>) -> String {
    pool.and_then(|p| m.pools.iter().find(|x| x.id == p))
        .map(|p| format!(", pool {}", p.name))
        .unwrap_or_default()
}

fn touch_target(m: &Manifest, og: &OwnershipGraph<'_>, t: &crate::model::format::Touch) -> String {
    if let Some(ti) = t.tensor.and_then(|id| og.tensor_index(id)) {
        let chains = og.owner_chains(ti);
        if chains.is_empty() {
            return format!("{} (tensor with no owner)", m.tensors[ti].layout());
        }
        return chains
            .iter()
            .map(|(c, r)| format!("{} ({r})", c.last().map_or("", String::as_str)))
            .collect::<Vec<_>>()
            .join(" = ");
    }
    match t
        .allocation
        .and_then(|a| og.allocation_index(a))
        .map(|i| &m.allocations[i])
    {
        Some(a) => {
            let pool = a.pool.and_then(|p| m.pools.iter().find(|x| x.id == p));
            match pool {
                Some(p) if p.kind == crate::model::format::PoolKind::Graph => {
                    format!("graph-pool intermediate (pool {})", p.name)
                }
                Some(p) => format!("no tensor; allocation in pool {}", p.name),
                None => "no tensor; allocation in no known pool".to_string(),
            }
        }
        None => "no tensor, no known allocation".to_string(),
    }
}

fn tensor_text(og: &OwnershipGraph<'_>, ti: usize, fmt: &dyn AddrFmt, out: &mut String) {
    let m = og.manifest;
    let t = &m.tensors[ti];
    let number = t.storage.map(|n| format!(" #{n}")).unwrap_or_default();
    let _ = writeln!(
        out,
        "  tensor {} at {} (storage{number} {}+{} bytes, offset {}){}",
        t.layout(),
        fmt.addr(t.data_ptr()),
        fmt.addr(t.storage_base),
        t.storage_nbytes,
        t.offset,
        pool_suffix(m, t.pool)
    );
    if let Some(d) = &t.digest {
        let _ = writeln!(out, "  digest {}", d.0);
    }
    if !t.alloc_site.is_empty() {
        out.push_str("  allocated at:\n");
        for f in &t.alloc_site {
            let _ = writeln!(out, "    {}:{} in {}", f.filename, f.line, f.name);
        }
    }
    let chains = og.owner_chains(ti);
    if chains.is_empty() {
        out.push_str("  owners: none (no owner path reaches it)\n");
    } else {
        out.push_str("  owners:\n");
        for (chain, reg) in &chains {
            let leaf = chain.last().map_or("", String::as_str);
            let holder = m
                .owners
                .iter()
                .find(|o| o.path == leaf)
                .and_then(|o| o.holder.as_deref())
                .map(|h| format!(", on {h}"))
                .unwrap_or_default();
            let _ = writeln!(out, "    {leaf} ({reg}{holder})");
            let hops: Vec<&str> = chain.iter().map(|p| og.hop_label(p)).collect();
            let _ = writeln!(out, "      chain: {}", hops.join(" → "));
        }
    }
    storage_sharers(m, ti, out);
    let touches = og.touches_of(ti);
    let graphs = og.graphs_touching(ti);
    if touches.is_empty() {
        out.push_str("  read by no captured node\n");
    } else {
        let _ = writeln!(
            out,
            "  held by {} node parameter(s) in {} graph(s): {}",
            touches.len(),
            graphs.len(),
            graphs.join(", ")
        );
        let mut lines: Vec<(&str, u32, u32, u32, &str)> = touches
            .iter()
            .map(|&(g, n, param, offset)| {
                let graph = &m.graphs[g as usize];
                let node = &graph.nodes[n as usize];
                (graph.name.as_str(), node.index, param, offset, &*node.name)
            })
            .collect();
        lines.sort();
        for (graph, index, param, offset, name) in lines {
            let _ = writeln!(
                out,
                "    {graph}#{index} {} param {param} +{offset}",
                crate::present::fmt::shorten(name, 120)
            );
        }
    }
}

/// Owner paths of the other tensors whose storage holds every byte of tensor `ti`'s view:
/// the bases and sibling views that keep its bytes alive. A view held only through plain
/// attributes is registered through a registered one (`docs/findings.md`), and it is still
/// reached through them when its own path goes.
fn storage_sharers(m: &Manifest, ti: usize, out: &mut String) {
    let t = &m.tensors[ti];
    let (start, end) = (t.data_ptr().0, t.data_ptr().0.saturating_add(t.nbytes));
    let holders: BTreeSet<crate::model::format::TensorId> = m
        .tensors
        .iter()
        .enumerate()
        .filter(|&(i, s)| {
            i != ti
                && s.same_storage_object(t)
                && s.storage_base.0 <= start
                && end <= s.storage_base.0.saturating_add(s.storage_nbytes)
        })
        .map(|(_, s)| s.id)
        .collect();
    let mut paths: Vec<(&str, crate::model::format::Registration)> = m
        .owners
        .iter()
        .filter(|o| holders.contains(&o.tensor))
        .map(|o| (o.path.as_str(), o.registration))
        .collect();
    if paths.is_empty() {
        return;
    }
    paths.sort();
    let list = |paths: &[&(&str, crate::model::format::Registration)]| {
        paths
            .iter()
            .map(|(p, r)| format!("{p} ({r})"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let all: Vec<_> = paths.iter().collect();
    let _ = writeln!(out, "  storage shared with: {}", list(&all));
    let own_registered = m
        .owners
        .iter()
        .any(|o| o.tensor == t.id && o.registration.is_registered());
    let through: Vec<_> = paths.iter().filter(|(_, r)| r.is_registered()).collect();
    if !own_registered && !through.is_empty() {
        let _ = writeln!(
            out,
            "  registered through: {}; sleep and in-place reloads restore these bytes",
            list(&through)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::present::fmt::RawAddrs;
    use crate::testkit::{BASE, manifest};

    #[test]
    fn queries_parse_and_explain_what_they_name() {
        assert_eq!(
            Query::parse("0x7f2c00001000"),
            Ok(Query::Address(Addr(0x7f2c_0000_1000)))
        );
        assert_eq!(Query::parse("model.w"), Ok(Query::Owner("model.w".into())));
        let m = manifest();
        let e = explain(&m, &Query::Owner("model.scale_alias".into()), &RawAddrs);
        assert!(e.found);
        assert!(
            e.text.contains("model.scale (module_attribute)"),
            "{}",
            e.text
        );
        assert!(e.text.contains("chain: model → scale_alias"), "{}", e.text);
        assert!(e.text.contains("bs8#0 k0 param 0 +8"), "{}", e.text);

        let e = explain(&m, &Query::Address(Addr(BASE + 0x4000)), &RawAddrs);
        assert!(e.found);
        assert!(
            e.text
                .contains("held without a tensor by 1 node parameter(s)"),
            "{}",
            e.text
        );

        let e = explain(&m, &Query::Kernel("k0".into()), &RawAddrs);
        assert!(
            e.text.contains("graph-pool intermediate (pool graph)"),
            "{}",
            e.text
        );
        assert!(e.text.contains("-> model.w (parameter)"), "{}", e.text);

        assert!(!explain(&m, &Query::Owner("model.nope".into()), &RawAddrs).found);
        assert!(!explain(&m, &Query::Address(Addr(0x10)), &RawAddrs).found);
        assert!(!explain(&m, &Query::Kernel("gemm".into()), &RawAddrs).found);
    }

    /// Regression: a malformed address is an error naming what is wrong, never an owner
    /// path; so are an empty target and an empty kernel pattern (which matched every node).
    #[test]
    fn malformed_targets_are_errors_not_owner_paths() {
        let why = |s: &str| match Query::parse(s) {
            Err(QueryError::Address { why, .. }) => why,
            other => panic!("{s:?} gave {other:?}"),
        };
        assert_eq!(why("0x"), "no hexadecimal digits follow `0x`");
        assert_eq!(why("0xZZ"), "'Z' is not a hexadecimal digit");
        assert_eq!(
            why("0x7f2c000010000000000a"),
            "20 hexadecimal digits, but an address has at most 16"
        );
        assert_eq!(
            why("0X7F2C00001000"),
            "write the prefix as a lowercase `0x` (0x7F2C00001000)"
        );
        assert_eq!(Query::parse(""), Err(QueryError::Empty));
        assert_eq!(Query::parse("  "), Err(QueryError::Empty));
        assert_eq!(Query::kernel(""), Err(QueryError::EmptyKernel));
        assert_eq!(Query::kernel("gemm"), Ok(Query::Kernel("gemm".into())));
        // Sixteen digits, leading zeros included, are an address.
        assert_eq!(
            Query::parse("0x0000000000000010"),
            Ok(Query::Address(Addr(0x10)))
        );
    }

    /// Regression: an owner-path query shows the allocation of the tensor (base, size,
    /// pool), as an address query does.
    #[test]
    fn owner_queries_show_the_allocation() {
        let m = manifest();
        let e = explain(&m, &Query::Owner("model.w".into()), &RawAddrs);
        assert!(e.found);
        let t = m.tensors.iter().find(|t| {
            m.owners
                .iter()
                .any(|o| o.path == "model.w" && o.tensor == t.id)
        });
        let al = t
            .and_then(|t| t.allocation)
            .and_then(|a| m.allocations.iter().find(|x| x.id == a))
            .expect("the test manifest's model.w lies in an allocation");
        let line = format!("  in allocation {}+{} (", al.base, al.size);
        assert!(e.text.contains(&line), "no {line:?} in\n{}", e.text);
    }

    #[test]
    fn control_characters_from_documents_are_escaped_in_text_and_dot() {
        // Guards: a graph, kernel or owner name holding `\r`, NUL or an ANSI escape reaches
        // explain's text and DOT escaped, never raw.
        let mut m = manifest();
        let w = m.owners.iter().position(|o| o.path == "model.w").unwrap();
        m.owners[w].path = crate::model::owner_path::OwnerPath::parse("model.w\r\u{1b}2J").unwrap();
        for g in &mut m.graphs {
            g.name.push('\0');
            for n in &mut g.nodes {
                n.name = format!("{}\u{9b}", n.name).into();
            }
        }
        let e = explain(&m, &Query::Owner("model.w\r\u{1b}2J".into()), &RawAddrs);
        assert!(e.found, "{}", e.text);
        let k = explain(&m, &Query::Kernel("k".into()), &RawAddrs);
        for (what, text) in [("text", &e.text), ("dot", &e.dot), ("kernels", &k.text)] {
            for line in text.lines() {
                assert!(!line.chars().any(char::is_control), "{what}: {line:?}");
            }
        }
        assert!(e.text.contains("model.w\\r\\u{1b}2J"), "{}", e.text);
        assert!(
            e.dot.contains("\\u{0}") || e.dot.contains("\\u{1b}"),
            "{}",
            e.dot
        );
    }
}
