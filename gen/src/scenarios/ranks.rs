//! Scenarios of several ranks (`verify DIR`): the per-rank manifests and live snapshots a
//! tensor-parallel engine writes, one folder per run, and what the one report must say.

use super::*;
use crate::index::{RankFinding, RanksExpect};

/// One run of several ranks: its documents by file name, and what `verify DIR` must say.
#[derive(Clone, Debug)]
pub struct RankScenario {
    pub name: &'static str,
    pub description: String,
    pub models: &'static str,
    /// File name and document (`Ok` a manifest, `Err` a live snapshot), in name order.
    pub files: Vec<(String, Result<Manifest, Live>)>,
    pub expect: RanksExpect,
}

impl RankScenario {
    /// How the files were made, as the index states it.
    pub fn made_by(&self) -> String {
        format!(
            "graphcheck-gen fixtures (synthetic model of {}; no GPU)",
            self.models
        )
    }
}

/// Every run of several ranks, in index order.
pub fn all() -> Vec<RankScenario> {
    vec![tp2_rebind_rank1(), tp4_shard_shape_mismatch()]
}

const DOWN_WEIGHT: &str = "model.layers[0].mlp.down_proj.weight";

fn on_rank<T>(
    rank: u32,
    world_size: u32,
    doc: &mut T,
    producer: impl Fn(&mut T) -> &mut graphcheck::model::format::Producer,
) {
    let p = producer(doc);
    p.rank = rank;
    p.world_size = world_size;
}

/// The file names `graphcheck.torch.instrument()` gives a rank's manifest (one pid each).
fn manifest_name(rank: u32) -> String {
    format!("graphcheck-{rank}-{}.json", 4100 + rank)
}

fn live_name(rank: u32) -> String {
    format!("live-{rank}-{}.json", 4100 + rank)
}

fn rank_finding(rank: Option<u32>, kind: Kind, subject: &str) -> RankFinding {
    RankFinding {
        rank,
        kind,
        subject: subject.into(),
    }
}

fn tp2_rebind_rank1() -> RankScenario {
    let mut files = Vec::new();
    for rank in 0..2 {
        let (mut doc, _, _, _) = dense(AttnOpts::default());
        let mut manifest = doc.manifest();
        on_rank(rank, 2, &mut manifest, |m| &mut m.producer);
        if rank == 0 {
            reload_parameters_in_place(&mut doc, true);
        } else {
            // Rank 1's loader replaces down_proj's weight by a new Parameter instead of
            // copying into it, and the old storage is freed.
            reload_parameters_in_place(&mut doc, false);
            let old = doc.tensor_at(DOWN_WEIGHT);
            let shape = doc.get(old).shape.clone();
            let new = fresh(&mut doc, BF16, &shape);
            doc.rebind(DOWN_WEIGHT, new);
            doc.free(old);
        }
        let mut live = doc.live(&manifest, RELOAD, Contents::Updated);
        on_rank(rank, 2, &mut live, |l| &mut l.producer);
        files.push((manifest_name(rank), Ok(manifest)));
        files.push((live_name(rank), Err(live)));
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    RankScenario {
        name: "tp2_rebind_rank1",
        description: "The dense decoder layer of clean_reload_inplace served with tensor \
            parallelism 2: each rank writes its manifest and, after reload_weights(), its live \
            snapshot. Rank 0 copies every parameter back in place (clean); rank 1's loader \
            rebinds down_proj's weight to a new Parameter and frees the old storage, which the \
            graphs of rank 1 still read. One report: the findings on rank 1 only, each naming \
            its rank."
            .into(),
        models: "a TP=2 run where one rank's reload rebinds a weight (vllm#48312 on one rank)",
        files,
        expect: RanksExpect {
            exit_code: 1,
            findings: vec![
                rank_finding(Some(1), Kind::Drifted, DOWN_WEIGHT),
                rank_finding(Some(1), Kind::Freed, DOWN_WEIGHT),
            ],
            missing_ranks: vec![],
        },
    }
}

fn tp4_shard_shape_mismatch() -> RankScenario {
    let mut files = Vec::new();
    let mut shapes = Vec::new();
    for rank in 0..3 {
        let (doc, _, _, _) = dense(AttnOpts::default());
        let mut manifest = doc.manifest();
        on_rank(rank, 4, &mut manifest, |m| &mut m.producer);
        let id = manifest
            .owners
            .iter()
            .find(|o| o.path == DOWN_WEIGHT)
            .expect("down_proj's weight")
            .tensor;
        let t = manifest
            .tensors
            .iter_mut()
            .find(|t| t.id == id)
            .expect("its tensor");
        if rank == 2 {
            // Rank 2 sharded down_proj along the other dimension: as many elements, in
            // the same storage, in another shape.
            t.shape = vec![t.shape[0] * 2, t.shape[1] / 2];
            t.stride = vec![t.shape[1] as i64, 1];
        }
        shapes.push(t.shape.clone());
        files.push((manifest_name(rank), Ok(manifest)));
    }
    assert_ne!(shapes[0], shapes[2], "rank 2's shape differs");
    RankScenario {
        name: "tp4_shard_shape_mismatch",
        description: "Capture-time manifests of a TP=4 run of the dense decoder layer, of \
            which only ranks 0 to 2 wrote theirs (rank 3 is missing: a warning). Rank 2 holds \
            down_proj's weight in another shape (as many elements, sharded along the other \
            dimension): a rank that loaded another shard layout. One rank_mismatch finding, \
            naming the shape of each rank."
            .into(),
        models: "a TP=4 run whose ranks shard a weight differently",
        files,
        expect: RanksExpect {
            exit_code: 1,
            findings: vec![rank_finding(None, Kind::RankMismatch, DOWN_WEIGHT)],
            missing_ranks: vec![3],
        },
    }
}
