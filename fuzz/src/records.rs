//! The records' own consistency, stated apart from the loader's code: what every accepted
//! document must satisfy (each tensor's byte span follows from its layout and lies in its
//! storage; one probe per address; node indexes once, parents walked before and holding a
//! body), and the `contradictions` target, which plants one violation of each kind in a
//! document that loads and requires the loader to refuse it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use graphcheck::codec::load::Source;
use graphcheck::model::dtype;
use graphcheck::model::format::{Addr, Document, Live, Manifest, Probe, Tensor};
use rand::Rng;
use rand::rngs::SmallRng;

use crate::Outcome;
use crate::targets::{Corpus, live_of};

/// The bytes a view spans, by walking its last element's offset in 128-bit arithmetic.
fn span(t: &Tensor) -> Option<u128> {
    if t.shape.contains(&0) {
        return Some(0);
    }
    let mut last: i128 = 0;
    for (&n, &s) in t.shape.iter().zip(&t.stride) {
        last = last.checked_add(i128::from(n - 1).checked_mul(i128::from(s))?)?;
    }
    u128::try_from(last + 1)
        .ok()?
        .checked_mul(u128::from(t.itemsize))
}

fn tensor_ok(i: usize, t: &Tensor) -> Result<(), String> {
    let bad = |why: &str| Err(format!("accepted tensors[{i}] ({}): {why}", t.layout()));
    if t.shape.len() != t.stride.len() || t.stride.iter().any(|&s| s < 0) {
        return bad("strides do not fit the shape");
    }
    match dtype::itemsize(&t.dtype) {
        Some(n) if n != t.itemsize => return bad("itemsize is not its dtype's"),
        None if !matches!(t.itemsize, 1 | 2 | 4 | 8 | 16) => return bad("implausible itemsize"),
        _ => {}
    }
    if span(t) != Some(u128::from(t.nbytes)) {
        return bad(&format!(
            "nbytes {} is not the span {:?}",
            t.nbytes,
            span(t)
        ));
    }
    let end = u128::from(t.offset) + u128::from(t.nbytes);
    if end > u128::from(t.storage_nbytes)
        || u128::from(t.storage_base.0) + u128::from(t.storage_nbytes) > u128::from(u64::MAX)
    {
        return bad("the view passes its storage, or the storage the address space");
    }
    Ok(())
}

/// What every accepted document satisfies, or the first thing it breaks.
pub fn consistent(doc: &Document) -> Result<(), String> {
    for (i, t) in doc.tensors().iter().enumerate() {
        tensor_ok(i, t)?;
    }
    let mut storages = BTreeMap::new();
    for (i, t) in doc.tensors().iter().enumerate() {
        if let Some(n) = t.storage {
            let (base, size) = *storages
                .entry(n)
                .or_insert((t.storage_base, t.storage_nbytes));
            if (base, size) != (t.storage_base, t.storage_nbytes) {
                return Err(format!(
                    "accepted tensors[{i}] of storage {n} at a second base or size"
                ));
            }
        }
    }
    match doc {
        Document::Live(l) => {
            let mut seen = BTreeSet::new();
            if let Some(p) = l.probes.iter().find(|p| !seen.insert(p.addr)) {
                return Err(format!("accepted two probes of {}", p.addr));
            }
        }
        Document::Manifest(m) => {
            for (gi, g) in m.graphs.iter().enumerate() {
                let mut kinds: BTreeMap<u32, usize> = BTreeMap::new();
                for index in g
                    .nodes
                    .iter()
                    .map(|n| n.index)
                    .chain(g.unread.iter().map(|u| u.index))
                {
                    *kinds.entry(index).or_default() += 1;
                }
                if let Some((index, _)) = kinds.iter().find(|(_, n)| **n > 1) {
                    return Err(format!("accepted graphs[{gi}] with node {index} twice"));
                }
                for n in &g.nodes {
                    if let Some(p) = n.parent
                        && (p >= n.index || kinds.contains_key(&p))
                    {
                        return Err(format!(
                            "accepted graphs[{gi}] node {} in the body of node {p}",
                            n.index
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// One contradiction planted in a document that loads, named for the failure message.
fn plant(rng: &mut SmallRng, doc: &mut Document) -> Option<&'static str> {
    let tensors = match doc {
        Document::Manifest(m) => &mut m.tensors,
        Document::Live(l) => &mut l.tensors,
    };
    let choice = rng.random_range(0..8);
    if choice < 5 && !tensors.is_empty() {
        let i = rng.random_range(0..tensors.len());
        let t = &mut tensors[i];
        return Some(match choice {
            0 => {
                t.nbytes = t.nbytes.wrapping_add(rng.random_range(1..=4096));
                "nbytes off its span"
            }
            1 => {
                t.itemsize = [0, 3, 5, 32, u32::MAX][rng.random_range(0..5)];
                "an itemsize no dtype has"
            }
            2 => {
                t.shape.push(1 << 62);
                t.stride.push(1 << 40);
                "a span past 64 bits"
            }
            3 if t.storage_nbytes >= 2 => {
                // Past the end by at least two bytes, whatever the storage's size.
                t.storage_base = Addr(u64::MAX - rng.random_range(0..t.storage_nbytes - 1));
                t.allocation = None;
                "a storage past the address space"
            }
            3 | 4 => {
                t.stride.push(1);
                "a stride too many"
            }
            _ => unreachable!("choice < 5"),
        });
    }
    if choice == 5 && tensors.len() >= 2 {
        // Two records of one storage number at different places.
        let (i, j) = (
            rng.random_range(0..tensors.len()),
            rng.random_range(0..tensors.len()),
        );
        if i != j
            && (tensors[i].storage_base, tensors[i].storage_nbytes)
                != (tensors[j].storage_base, tensors[j].storage_nbytes)
        {
            let n = rng.random_range(0..4);
            tensors[i].storage = Some(n);
            tensors[j].storage = Some(n);
            return Some("one storage number at two bases");
        }
    }
    match doc {
        Document::Live(l) => duplicate_probe(rng, l),
        Document::Manifest(m) => node_fault(rng, m),
    }
}

fn duplicate_probe(rng: &mut SmallRng, l: &mut Live) -> Option<&'static str> {
    if l.probes.is_empty() {
        return None;
    }
    let p = l.probes[rng.random_range(0..l.probes.len())].clone();
    let at = rng.random_range(0..=l.probes.len());
    l.probes.insert(
        at,
        Probe {
            state: graphcheck::model::format::AllocState::Active,
            ..p
        },
    );
    Some("two probes of one address")
}

fn node_fault(rng: &mut SmallRng, m: &mut Manifest) -> Option<&'static str> {
    let g = m.graphs.iter_mut().find(|g| g.nodes.len() >= 2)?;
    let a = rng.random_range(0..g.nodes.len());
    let b = (a + 1 + rng.random_range(0..g.nodes.len() - 1)) % g.nodes.len();
    Some(match rng.random_range(0..3) {
        0 => {
            g.nodes[b].index = g.nodes[a].index;
            "two nodes of one index"
        }
        1 => {
            g.nodes[a].parent = Some(g.nodes[a].index.saturating_add(rng.random_range(0..100)));
            "a parent not walked before its node"
        }
        _ => {
            g.nodes[b].parent = Some(g.nodes[a].index);
            if g.nodes[a].index >= g.nodes[b].index {
                g.nodes[b].index = g.nodes[a].index + 1;
                // An index now given twice is a fault too; either is refused.
            }
            "a parent that holds no body"
        }
    })
}

/// Plants one contradiction in a corpus manifest, or its nothing-changed live snapshot,
/// written in either format: the loader must refuse it, naming a JSON path. A third of the
/// cases plant nothing, and must load (the documents are the corpus's own).
pub fn contradictions(rng: &mut SmallRng, c: &Corpus) -> (Vec<u8>, Outcome) {
    let m = c.manifests[rng.random_range(0..c.manifests.len())].clone();
    let mut doc = if rng.random_bool(0.5) {
        Document::Manifest(m.clone())
    } else {
        Document::Live(live_of(&m))
    };
    let planted = if rng.random_bool(1.0 / 3.0) {
        None
    } else {
        plant(rng, &mut doc)
    };
    let version = rng.random_range(1..=2);
    let bytes = match doc {
        Document::Manifest(m) => serde_json::to_vec(&m.in_version(version)),
        Document::Live(l) => serde_json::to_vec(&l.in_version(version)),
    }
    .expect("a document serializes");
    let loaded = Source::Text {
        bytes: bytes.clone(),
        name: PathBuf::from("<fuzz>"),
    }
    .document();
    let outcome = match (planted, loaded) {
        (None, Ok(d)) => match consistent(&d) {
            Ok(()) => Outcome::Accepted,
            Err(e) => Outcome::Failed(e),
        },
        (None, Err(e)) => Outcome::Failed(format!("a corpus document no longer loads: {e}")),
        (Some(what), Ok(_)) => Outcome::Failed(format!("format {version}: {what} was accepted")),
        (Some(what), Err(e)) if !e.to_string().contains("invalid document at `") => {
            Outcome::Failed(format!(
                "format {version}: {what} refused without a JSON path: {e}"
            ))
        }
        (Some(_), Err(_)) => Outcome::Rejected,
    };
    (bytes, outcome)
}
