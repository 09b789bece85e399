//! The synthetic scenario corpus. Each scenario models one upstream failure (or its
//! absence) on a one-layer slice of a vLLM model captured at two batch sizes, and states,
//! next to its data, every finding `docs/findings.md` gives for it: derived by hand from
//! those rules, never by running a verifier.

use graphcheck::model::format::{Contents, Live, Manifest, Registration, TensorId};

use crate::doc::{At, BF16, Doc, F32, FP8, GRAPH_POOL, I32, I64, WEIGHTS, zero_digest};
use crate::index::{Expect, ExpectedFinding, Kind, Severity};
use crate::model::{
    Acts, AttnOpts, BATCHES, FUSED_ADD_RMS_NORM, HIDDEN, Layer, MAX_POSITIONS, MUL_SCALAR_TENSOR,
    Mlp, Model, NVJET_A, NVJET_B, NVJET_C, NVJET_D, RMS_NORM, ROTARY, TI_A, TI_B, TI_OUT, VOCAB,
    nvjet, silu_and_mul,
};

mod captures;
mod dense;
mod gemma3n;
mod identity;
mod marlin;
mod mla;
mod moe;
pub mod ranks;

use captures::{rebind_between_captures, reuse_between_captures, sliced_static_input};
use dense::{
    allowlisted_workspace, clean_reload_inplace, freed_then_reused, inplace_reshape,
    kv_pool_metadata, module_global_cache, module_global_cache_rebuilt, retarget_one_graph_refused,
};
use gemma3n::gemma3n_sleep2_stale;
use identity::{lora_scalings_list_shift, mla_views_dropped, mla_views_rebound_base};
use marlin::marlin_workspace_rebuilt;
use mla::{mla_wuv_plain_attrs, mla_wuv_reload_drifted};
use moe::{
    cutlass_moe_alias_split, cutlass_moe_strides_alias, owner_removed, two_graphs_recapture,
};

/// One scenario: its documents and what `verify` must say about them.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: &'static str,
    pub description: String,
    /// The upstream issue it models, for `made_by`.
    pub models: &'static str,
    pub manifest: Manifest,
    pub live: Option<Live>,
    pub allow: Option<String>,
    pub explain: Vec<String>,
    pub expect: Expect,
}

impl Scenario {
    /// How the files were made, as the index states it.
    pub fn made_by(&self) -> String {
        format!(
            "graphcheck-gen fixtures (synthetic model of {}; no GPU)",
            self.models
        )
    }
}

/// Every scenario, in index order.
pub fn all() -> Vec<Scenario> {
    vec![
        clean_reload_inplace(),
        marlin_workspace_rebuilt(),
        cutlass_moe_strides_alias(),
        mla_wuv_plain_attrs(),
        mla_wuv_reload_drifted(),
        gemma3n_sleep2_stale(),
        freed_then_reused(),
        inplace_reshape(),
        module_global_cache(),
        kv_pool_metadata(),
        owner_removed(),
        two_graphs_recapture(),
        allowlisted_workspace(),
        mla_views_dropped(),
        mla_views_rebound_base(),
        lora_scalings_list_shift(),
        module_global_cache_rebuilt(),
        reuse_between_captures(),
        rebind_between_captures(),
        sliced_static_input(),
        cutlass_moe_alias_split(),
        retarget_one_graph_refused(),
    ]
}

const BOTH: &[&str] = &["decode_bs1", "decode_bs8"];
const BS8: &[&str] = &["decode_bs8"];

/// The reload of new weights every reload scenario does (vLLM's layerwise reload).
const RELOAD: &str = "reload_weights() with new weights (layerwise reload, graphs kept)";

/// A finding as `verify` reports it without `--deny-unused-allow`: an unused allowlist
/// entry is a warning, everything else an error.
fn finding(kind: Kind, subject: &str, graphs: &[&str]) -> ExpectedFinding {
    ExpectedFinding {
        kind,
        subject: subject.into(),
        graphs: (!graphs.is_empty()).then(|| graphs.iter().map(|g| g.to_string()).collect()),
        severity: if kind == Kind::UnusedAllow {
            Severity::Warning
        } else {
            Severity::Error
        },
    }
}

/// Exit 1 when a finding is an error, 0 when there are none or only warnings.
fn exit_code(findings: &[ExpectedFinding]) -> i32 {
    i32::from(findings.iter().any(|f| f.severity == Severity::Error))
}

fn expect(findings: Vec<ExpectedFinding>) -> Expect {
    Expect {
        exit_code: exit_code(&findings),
        findings,
        allowed: Vec::new(),
        plan: None,
    }
}

/// `e` with the retarget plan the scenario states: the graphs patched, those recaptured.
fn planned(mut e: Expect, retarget: &[&str], recapture: &[&str]) -> Expect {
    let names = |v: &[&str]| {
        let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
        v.sort();
        v
    };
    e.plan = Some(crate::index::ExpectPlan {
        retarget: names(retarget),
        recapture: names(recapture),
    });
    e
}

/// Captures every batch size of [`BATCHES`] into the shared graph pool.
fn capture(doc: &mut Doc, mut body: impl FnMut(&mut Doc, usize, &Acts)) {
    for (name, bs) in BATCHES {
        let g = doc.graph(name);
        let x = Acts::new(doc, bs);
        body(doc, g, &x);
    }
}

/// New weights copied into every parameter in place: same storage, new contents.
fn reload_parameters_in_place(doc: &mut Doc, reference: bool) {
    for t in parameters(doc) {
        doc.rewrite(t, 1);
        if reference {
            let d = doc.get(t).digest.clone();
            doc.get_mut(t).reference_digest = d;
        }
    }
}

fn parameters(doc: &Doc) -> Vec<TensorId> {
    let m = doc.manifest();
    let mut v: Vec<TensorId> = m
        .owners
        .iter()
        .filter(|o| o.registration == Registration::Parameter)
        .map(|o| o.tensor)
        .collect();
    v.sort();
    v.dedup();
    v
}

/// The captured address of the tensor an owner path holds, in hex (an `explain` query).
fn hex_of(m: &Manifest, path: &str) -> String {
    let o = m.owners.iter().find(|o| o.path == path).expect("owner");
    let t = m.tensors.iter().find(|t| t.id == o.tensor).expect("tensor");
    t.data_ptr().to_string()
}

/// A tensor a reload allocates anew; persistent contents get a digest.
fn fresh(doc: &mut Doc, dtype: crate::doc::Dtype, shape: &[u64]) -> TensorId {
    let t = doc.tensor(WEIGHTS, dtype, shape);
    doc.rewrite(t, 1);
    t
}

/// The standard one-layer decoder with a bf16 MLP.
fn dense(opts: AttnOpts) -> (Doc, Model, Layer, Mlp) {
    let mut doc = Doc::new();
    let model = Model::new(&mut doc, "model", VOCAB);
    let layer = Layer::new(&mut doc, "model.layers[0]", opts);
    let mlp = Mlp::new(&mut doc, "model.layers[0]", false);
    {
        let (model, layer, mlp) = (model.clone(), layer.clone(), mlp);
        capture(&mut doc, |doc, g, x| {
            model.embed(doc, g, x);
            layer.attention(doc, g, &model.inputs, x);
            mlp.launch(doc, g, x);
            model.finish(doc, g, x);
        });
    }
    (doc, model, layer, mlp)
}
