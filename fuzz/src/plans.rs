//! The `plans` target: retarget plans, made and read back. A plan made from a corpus
//! manifest and a live snapshot in which one persistent owner moved passes
//! [`Plan::check`]; the same plan mutated as JSON is either refused (it does not parse, or
//! contradicts itself) or, accepted, applies on the host stand-in all or nothing (every
//! word as the plan says, or every word as it was), and gives a manifest after, without a
//! panic anywhere.

use graphcheck::check::allow::Allowlist;
use graphcheck::model::format::{Addr, Live, Manifest, TensorId};
use graphcheck::plan::apply::{HostGraph, apply_graph, retargeted_manifest};
use graphcheck::plan::{Action, Plan, plan};
use rand::Rng;
use rand::rngs::SmallRng;

use crate::Outcome;
use crate::mutate::mutate_json;
use crate::targets::{Corpus, live_of};

/// `live_of(m)` with the tensor of one persistent owner moved to a new record of its
/// layout past every address the manifest holds.
fn moved(rng: &mut SmallRng, m: &Manifest) -> Option<Live> {
    let mut l = live_of(m);
    let persistent: Vec<usize> = (0..l.owners.len())
        .filter(|&i| l.owners[i].registration.is_persistent())
        .collect();
    let &o = persistent.get(rng.random_range(0..persistent.len().max(1)))?;
    let t = l
        .tensors
        .iter()
        .find(|t| t.id == l.owners[o].tensor)?
        .clone();
    let top = m
        .tensors
        .iter()
        .map(|t| t.storage_base.0.saturating_add(t.storage_nbytes))
        .chain(
            m.allocations
                .iter()
                .map(|a| a.base.0.saturating_add(a.size)),
        )
        .max()
        .unwrap_or(0);
    let mut new = t;
    new.id = TensorId(
        l.tensors
            .iter()
            .map(|t| t.id.0)
            .max()
            .unwrap_or(0)
            .checked_add(1)?,
    );
    new.storage_base = Addr(top.checked_add(0x10_0000)? & !0xfff);
    (new.allocation, new.pool, new.digest, new.storage) = (None, None, None, None);
    l.owners[o].tensor = new.id;
    l.tensors.push(new);
    Some(l)
}

pub fn plans(rng: &mut SmallRng, c: &Corpus) -> (Vec<u8>, Outcome) {
    let m = &c.manifests[rng.random_range(0..c.manifests.len())];
    let Some(l) = moved(rng, m) else {
        return (Vec::new(), Outcome::Rejected);
    };
    let Ok(r) = graphcheck::check::verify::verify(m, Some(&l), &Allowlist::default()) else {
        return (Vec::new(), Outcome::Rejected);
    };
    let made = match plan(m, &l, &r) {
        Ok(p) => p,
        Err(e) => {
            return (
                Vec::new(),
                Outcome::Failed(format!("no plan of a live pair: {e}")),
            );
        }
    };
    let text = serde_json::to_vec(&made).expect("a plan serializes");
    if let Err(e) = made.check() {
        return (
            text,
            Outcome::Failed(format!("a made plan contradicts itself: {e}")),
        );
    }
    let mut v: serde_json::Value = serde_json::from_slice(&text).expect("a plan is JSON");
    mutate_json(rng, &mut v, &c.documents, &c.dict);
    let bytes = serde_json::to_vec(&v).expect("a Value serializes");
    let Ok(p) = serde_json::from_slice::<Plan>(&bytes) else {
        return (bytes, Outcome::Rejected);
    };
    if p.check().is_err() {
        return (bytes, Outcome::Rejected);
    }
    for gp in &p.graphs {
        let mut h = HostGraph::of(m, &gp.graph);
        let before = h.words.clone();
        let applied = apply_graph(&mut h, gp).applied();
        let mut want = before.clone();
        if applied {
            for e in &gp.edits {
                want.insert((e.node, e.param, e.offset), e.new.0);
            }
        }
        if h.words != want {
            return (
                bytes,
                Outcome::Failed(format!(
                    "graph {:?} ({}) holds other words after applying than the plan says",
                    gp.graph,
                    if applied { "applied" } else { "refused" }
                )),
            );
        }
        if applied && gp.action != Action::Retarget {
            return (
                bytes,
                Outcome::Failed(format!(
                    "graph {:?} applied, planned {:?}",
                    gp.graph, gp.action
                )),
            );
        }
    }
    let _ = retargeted_manifest(m, &l, &p, &p.retarget);
    (bytes, Outcome::Accepted)
}
