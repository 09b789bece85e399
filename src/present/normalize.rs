//! Normalization: the stable text of a manifest (addresses as symbolic ids, deterministic
//! order) that snapshot tests store, and the redactor that maps any address of a document
//! to its symbolic id, for users who snapshot graphcheck's output themselves. Text from
//! documents goes through [`escape`], as everywhere text meets the terminal.

use crate::model::ids::IdIndex;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use crate::index::address::IntervalIndex;
use crate::model::format::{
    Addr, Document, Live, Manifest, Owner, Pool, PoolId, RangeDigest, Tensor,
};
use crate::present::fmt::{AddrFmt, escape};

/// Maps addresses to symbolic ids: `A3+0x200` is 0x200 bytes into the fourth allocation in
/// canonical order; `S1+0x0` a storage outside any known allocation; `?` anything else.
///
/// Canonical order of allocations: first touched, walking graphs by name, nodes by index,
/// touches by (parameter, offset); then those holding owned tensors, by smallest owner
/// path; then the rest by (size, base).
#[derive(Clone, Debug, Default)]
pub struct Symbolizer {
    allocs: IntervalIndex<usize>,
    storages: IntervalIndex<usize>,
}

impl Symbolizer {
    pub fn for_manifest(m: &Manifest) -> Symbolizer {
        let mut order: Vec<Addr> = Vec::new();
        let mut graphs: Vec<_> = m.graphs.iter().collect();
        graphs.sort_by(|a, b| a.name.cmp(&b.name));
        for g in graphs {
            let mut nodes: Vec<_> = g.nodes.iter().collect();
            nodes.sort_by_key(|n| n.index);
            for n in nodes {
                let mut touches: Vec<_> = n.touches.iter().collect();
                touches.sort_by_key(|t| (t.param, t.offset));
                order.extend(touches.iter().map(|t| t.addr));
            }
        }
        Symbolizer::build(&m.allocations, &m.tensors, &m.owners, order)
    }

    pub fn for_live(l: &Live) -> Symbolizer {
        let order = l.probes.iter().map(|p| p.addr).collect();
        Symbolizer::build(&l.allocations, &l.tensors, &l.owners, order)
    }

    pub fn for_document(d: &Document) -> Symbolizer {
        match d {
            Document::Manifest(m) => Symbolizer::for_manifest(m),
            Document::Live(l) => Symbolizer::for_live(l),
        }
    }

    fn build(
        allocations: &[crate::model::format::Allocation],
        tensors: &[Tensor],
        owners: &[Owner],
        touch_order: Vec<Addr>,
    ) -> Symbolizer {
        let raw = IntervalIndex::new(
            allocations
                .iter()
                .enumerate()
                .map(|(i, a)| (a.base.0, a.base.0.saturating_add(a.size), i))
                .collect(),
        );
        let mut rank: Vec<Option<usize>> = vec![None; allocations.len()];
        let mut next = 0;
        let mut assign = |i: usize, rank: &mut Vec<Option<usize>>| {
            if rank[i].is_none() {
                rank[i] = Some(next);
                next += 1;
            }
        };
        for a in touch_order {
            if let Some(&i) = raw.stab_vec(a.0).first() {
                assign(i, &mut rank);
            }
        }
        let ix = IdIndex::positions(tensors.iter().map(|t| t.id));
        let mut by_path: Vec<(&str, usize)> = owners
            .iter()
            .filter_map(|o| Some((o.path.as_str(), ix.get(&o.tensor)?)))
            .collect();
        by_path.sort();
        for (_, t) in &by_path {
            if let Some(&i) = raw.stab_vec(tensors[*t].storage_base.0).first() {
                assign(i, &mut rank);
            }
        }
        let mut rest: Vec<usize> = (0..allocations.len())
            .filter(|&i| rank[i].is_none())
            .collect();
        rest.sort_by_key(|&i| (allocations[i].size, allocations[i].base));
        for i in rest {
            assign(i, &mut rank);
        }
        let allocs = IntervalIndex::new(
            allocations
                .iter()
                .enumerate()
                .map(|(i, a)| {
                    (
                        a.base.0,
                        a.base.0.saturating_add(a.size),
                        rank[i].unwrap_or(i),
                    )
                })
                .collect(),
        );
        // Storages no allocation holds, ordered by smallest owner path, then by size.
        let mut loose: Vec<(String, u64, u64, u64)> = Vec::new();
        let mut seen = HashMap::new();
        let first_path: HashMap<_, &str> = by_path.iter().rev().map(|&(p, t)| (t, p)).collect();
        for (ti, t) in tensors.iter().enumerate() {
            if raw.stab_vec(t.storage_base.0).is_empty()
                && seen.insert(t.storage_base, ()).is_none()
            {
                let key = first_path
                    .get(&ti)
                    .map_or(String::from("\u{10ffff}"), |p| p.to_string());
                loose.push((
                    key,
                    t.storage_nbytes,
                    t.storage_base.0,
                    t.storage_nbytes.max(1),
                ));
            }
        }
        loose.sort();
        let storages = IntervalIndex::new(
            loose
                .iter()
                .enumerate()
                .map(|(n, (_, _, base, len))| (*base, base.saturating_add(*len), n))
                .collect(),
        );
        Symbolizer { allocs, storages }
    }

    /// The symbolic id of an address.
    pub fn symbol(&self, a: Addr) -> String {
        let mut best: Option<(u64, usize)> = None;
        self.allocs.stab(a.0, |start, _, rank| {
            if best.is_none_or(|(s, _)| start > s) {
                best = Some((start, rank));
            }
        });
        if let Some((start, rank)) = best {
            return format!("A{rank}+{:#x}", a.0 - start);
        }
        self.storages.stab(a.0, |start, _, rank| {
            if best.is_none_or(|(s, _)| start > s) {
                best = Some((start, rank));
            }
        });
        match best {
            Some((start, rank)) => format!("S{rank}+{:#x}", a.0 - start),
            None => "?".to_string(),
        }
    }

    /// Replaces every `0x…` word of 8 to 16 hex digits in `text` with its symbol (`?` when
    /// no allocation or storage of the document holds it); shorter hex is left alone.
    pub fn redact(&self, text: &str) -> String {
        redact_words(text, |a| Some(self.symbol(a)))
    }
}

/// Replaces every `0x…` word of 8 to 16 hex digits in `text` that `name` names (`Some`)
/// with that name; shorter hex, and words `name` leaves (`None`), stay as they are.
pub(crate) fn redact_words(text: &str, name: impl Fn(Addr) -> Option<String>) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut copied = 0;
    while i + 2 < b.len() {
        if b[i] == b'0' && b[i + 1] == b'x' && (i == 0 || !b[i - 1].is_ascii_alphanumeric()) {
            let mut j = i + 2;
            while j < b.len() && b[j].is_ascii_hexdigit() {
                j += 1;
            }
            let digits = j - i - 2;
            if (8..=16).contains(&digits) && (j == b.len() || !b[j].is_ascii_alphanumeric()) {
                if let Some(symbol) = Addr::parse(&text[i..j]).and_then(&name) {
                    out.push_str(&text[copied..i]);
                    out.push_str(&symbol);
                    copied = j;
                }
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out.push_str(&text[copied..]);
    out
}

impl AddrFmt for Symbolizer {
    fn addr(&self, a: Addr) -> String {
        self.symbol(a)
    }
}

/// Pool names by id, escaped for printing.
fn pool_names(pools: &[Pool]) -> HashMap<PoolId, std::borrow::Cow<'_, str>> {
    pools.iter().map(|p| (p.id, escape(&p.name))).collect()
}

fn dims<T: ToString>(v: &[T]) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(", ")
}

fn short_digest(d: &crate::model::format::Digest) -> String {
    let (alg, hex) = d.0.split_once(':').unwrap_or(("", &d.0));
    let cut = hex.char_indices().nth(16).map_or(hex.len(), |(i, _)| i);
    format!("{}:{}", escape(alg), escape(&hex[..cut]))
}

fn tensor_section(
    out: &mut String,
    tensors: &[Tensor],
    owners: &[Owner],
    pools: &[Pool],
    sym: &Symbolizer,
) {
    let pools = pool_names(pools);
    let mut owners_of: BTreeMap<usize, Vec<&Owner>> = BTreeMap::new();
    let ix = IdIndex::positions(tensors.iter().map(|t| t.id));
    for o in owners {
        if let Some(i) = ix.get(&o.tensor) {
            owners_of.entry(i).or_default().push(o);
        }
    }
    let mut lines: Vec<(String, String)> = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        let mut os = owners_of.remove(&i).unwrap_or_default();
        os.sort_by(|a, b| a.path.cmp(&b.path));
        let head = if os.is_empty() {
            format!("(no owner) {}", sym.symbol(t.data_ptr()))
        } else {
            os.iter()
                .map(|o| match &o.holder {
                    Some(h) => {
                        format!("{} ({}, on {})", escape(&o.path), o.registration, escape(h))
                    }
                    None => format!("{} ({})", escape(&o.path), o.registration),
                })
                .collect::<Vec<_>>()
                .join(" = ")
        };
        let mut line = format!(
            "  {head}\n    {}[{}] stride [{}] at {} of storage {}+{} bytes",
            escape(&t.dtype),
            dims(&t.shape),
            dims(&t.stride),
            sym.symbol(t.data_ptr()),
            sym.symbol(t.storage_base),
            t.storage_nbytes
        );
        if let Some(p) = t.pool.and_then(|p| pools.get(&p)) {
            let _ = write!(line, ", pool {p}");
        }
        if let Some(d) = &t.digest {
            let _ = write!(line, ", digest {}", short_digest(d));
        }
        if let Some(d) = &t.reference_digest {
            let _ = write!(line, ", reference {}", short_digest(d));
        }
        if let Some(f) = t.alloc_site.first() {
            let _ = write!(
                line,
                "\n    allocated at {}:{} in {}",
                escape(&f.filename),
                f.line,
                escape(&f.name)
            );
        }
        lines.push((head, line));
    }
    lines.sort();
    for (_, l) in lines {
        out.push_str(&l);
        out.push('\n');
    }
}

fn pools_section(out: &mut String, pools: &[Pool]) {
    let mut ps: Vec<&Pool> = pools.iter().collect();
    ps.sort_by(|a, b| a.name.cmp(&b.name));
    out.push_str("pools:\n");
    for p in ps {
        let _ = writeln!(
            out,
            "  {}: {} (sleep: {})",
            escape(&p.name),
            p.kind,
            p.sleep,
        );
    }
}

/// The normalized text of a manifest: no raw address, no tool version, sorted; equal for
/// two recordings of the same model and graphs.
pub fn normalized_manifest(m: &Manifest) -> String {
    let sym = Symbolizer::for_manifest(m);
    let pools = pool_names(&m.pools);
    let ix = IdIndex::positions(m.tensors.iter().map(|t| t.id));
    let alloc_ix = IdIndex::positions(m.allocations.iter().map(|a| a.id));
    let mut first_owner: HashMap<usize, &str> = HashMap::new();
    let mut sorted_owners: Vec<&Owner> = m.owners.iter().collect();
    sorted_owners.sort_by(|a, b| a.path.cmp(&b.path));
    for o in sorted_owners {
        if let Some(i) = ix.get(&o.tensor) {
            first_owner.entry(i).or_insert(o.path.as_str());
        }
    }
    let mut out = String::new();
    let p = &m.producer;
    let _ = writeln!(
        out,
        "graphcheck manifest v{} from {} (rank {} of {})",
        m.format_version,
        escape(&p.tool),
        p.rank,
        p.world_size
    );
    pools_section(&mut out, &m.pools);
    let mut graphs: Vec<_> = m.graphs.iter().collect();
    graphs.sort_by(|a, b| a.name.cmp(&b.name));
    out.push_str("graphs:\n");
    for g in graphs {
        let counts: Vec<String> = g
            .node_counts
            .iter()
            .map(|(k, v)| format!("{} {v}", escape(k)))
            .collect();
        let _ = writeln!(
            out,
            "  {}{}: {}",
            escape(&g.name),
            g.pool
                .and_then(|p| pools.get(&p))
                .map(|p| format!(" (pool {p})"))
                .unwrap_or_default(),
            counts.join(", ")
        );
        for u in &g.unread {
            let _ = writeln!(
                out,
                "    #{} unread {}: {}",
                u.index,
                escape(&u.node_type),
                escape(&u.reason)
            );
        }
        let mut guards: Vec<String> = g
            .guards
            .iter()
            .map(|gu| {
                let paths: Vec<String> = gu.paths.iter().map(|p| escape(p).into_owned()).collect();
                format!("    guards {}: {}\n", sym.symbol(gu.addr), paths.join(", "))
            })
            .collect();
        guards.sort();
        guards.into_iter().for_each(|l| out.push_str(&l));
        let mut nodes: Vec<_> = g.nodes.iter().collect();
        nodes.sort_by_key(|n| n.index);
        for n in nodes {
            let mut head = format!("    #{} {} {}", n.index, n.kind, escape(&n.name));
            if let (Some(gr), Some(bl)) = (n.grid, n.block) {
                let _ = write!(head, " grid [{}] block [{}]", dims(&gr), dims(&bl));
            }
            if let Some(p) = n.parent {
                let _ = write!(head, " in #{p}");
            }
            out.push_str(&head);
            out.push('\n');
            if let Some(why) = &n.opaque {
                let _ = writeln!(out, "      opaque: {}", escape(why));
            }
            let mut touches: Vec<_> = n.touches.iter().collect();
            touches.sort_by_key(|t| (t.param, t.offset));
            for t in touches {
                let target = match t.tensor.and_then(|id| ix.get(&id)) {
                    Some(i) => first_owner
                        .get(&i)
                        .map_or("(tensor, no owner)".to_string(), |p| escape(p).into_owned()),
                    None => t
                        .allocation
                        .and_then(|a| alloc_ix.get(&a).map(|i| &m.allocations[i]))
                        .and_then(|a| a.pool)
                        .and_then(|p| pools.get(&p))
                        .map_or("(bare allocation)".to_string(), |p| {
                            format!("(bare, pool {p})")
                        }),
                };
                let _ = writeln!(
                    out,
                    "      param {} +{}: {} -> {}",
                    t.param,
                    t.offset,
                    sym.symbol(t.addr),
                    target
                );
            }
            // Stale words: where they were and why, not what they held (garbage).
            for w in &n.ignored {
                let reason = match w.reason {
                    crate::model::format::IgnoredReason::IndexSlot => "index slot",
                    crate::model::format::IgnoredReason::FreeMemory => "into free memory",
                    crate::model::format::IgnoredReason::RngState => "torch's RNG state",
                    crate::model::format::IgnoredReason::NcclComm => "NCCL's communicator",
                };
                let _ = writeln!(
                    out,
                    "      param {} +{}: ignored ({reason})",
                    w.param, w.offset
                );
            }
        }
    }
    out.push_str("tensors:\n");
    tensor_section(&mut out, &m.tensors, &m.owners, &m.pools, &sym);
    range_section(&mut out, &m.ranges, &sym);
    out
}

/// The digested ranges no owner explains, where a document has them (none: no section, as
/// documents before them read).
fn range_section(out: &mut String, ranges: &[RangeDigest], sym: &Symbolizer) {
    if ranges.is_empty() {
        return;
    }
    out.push_str("ranges (read by graphs, no owner):\n");
    let mut lines: Vec<String> = ranges
        .iter()
        .map(|r| {
            format!(
                "  {}+{} bytes, digest {}\n",
                sym.symbol(r.addr),
                r.size,
                short_digest(&r.digest)
            )
        })
        .collect();
    lines.sort();
    lines.into_iter().for_each(|l| out.push_str(&l));
}

/// The normalized text of a live snapshot.
pub fn normalized_live(l: &Live) -> String {
    let sym = Symbolizer::for_live(l);
    let pools = pool_names(&l.pools);
    let mut out = String::new();
    let p = &l.producer;
    let _ = writeln!(
        out,
        "graphcheck live snapshot v{} from {} (rank {} of {})\nevent: {} (contents {})",
        l.format_version,
        p.tool,
        p.rank,
        p.world_size,
        escape(&l.event.name),
        serde_json::to_value(l.event.contents)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default()
    );
    pools_section(&mut out, &l.pools);
    out.push_str("probes:\n");
    let mut probes: Vec<String> = l
        .probes
        .iter()
        .map(|pr| {
            format!(
                "  {}: {}{}",
                sym.symbol(pr.addr),
                serde_json::to_value(pr.state)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default(),
                pr.pool
                    .and_then(|p| pools.get(&p))
                    .map(|p| format!(", pool {p}"))
                    .unwrap_or_default()
            )
        })
        .collect();
    probes.sort();
    for p in probes {
        out.push_str(&p);
        out.push('\n');
    }
    out.push_str("tensors:\n");
    tensor_section(&mut out, &l.tensors, &l.owners, &l.pools, &sym);
    range_section(&mut out, &l.ranges, &sym);
    out
}

/// The normalized text of either document.
pub fn normalized(d: &Document) -> String {
    match d {
        Document::Manifest(m) => normalized_manifest(m),
        Document::Live(l) => normalized_live(l),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::format::{Allocation, AllocationId};

    #[test]
    fn symbols_follow_canonical_order_and_redact_only_addresses() {
        let allocs = vec![
            Allocation {
                id: AllocationId(0),
                base: Addr(0x7f00_0000_0000),
                size: 0x20_0000,
                pool: None,
            },
            Allocation {
                id: AllocationId(1),
                base: Addr(0x7f00_0040_0000),
                size: 0x20_0000,
                pool: None,
            },
        ];
        // The second allocation is touched first, so it becomes A0.
        let s = Symbolizer::build(&allocs, &[], &[], vec![Addr(0x7f00_0040_0100)]);
        assert_eq!(s.symbol(Addr(0x7f00_0040_0100)), "A0+0x100");
        assert_eq!(s.symbol(Addr(0x7f00_0000_0008)), "A1+0x8");
        assert_eq!(s.symbol(Addr(0x10)), "?");
        assert_eq!(
            s.redact("at 0x7f0000400100, param 0x10, id 0x7f00000000081"),
            "at A0+0x100, param 0x10, id ?"
        );
    }
}

#[cfg(test)]
mod escape_tests {
    use super::*;
    use crate::model::owner_path::OwnerPath;

    #[test]
    fn normalized_text_escapes_control_characters() {
        // Guards: `show --normalized` printed owner paths, graph, node and pool names raw.
        let mut m = crate::testkit::manifest();
        m.owners[1].path = OwnerPath::parse("model.sc\rale\0x").unwrap();
        m.graphs[0].name = "bs1\u{1b}[31m".into();
        m.graphs[0].nodes[0].name = "k\r0".into();
        m.pools[0].name = "wei\u{85}ghts".into();
        let text = normalized_manifest(&m);
        for line in text.lines() {
            assert!(!line.chars().any(char::is_control), "{line:?}");
        }
        assert!(
            text.contains("model.sc\\rale\\u{0}x (module_attribute)"),
            "{text}"
        );
        assert!(
            text.contains("  bs1\\u{1b}[31m (pool graph): kernel 2"),
            "{text}"
        );
        assert!(text.contains("#0 kernel k\\r0"), "{text}");
        assert!(text.contains("wei\\u{85}ghts"), "{text}");
    }
}
