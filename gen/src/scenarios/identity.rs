//! Identity follows the storage: absorbed MLA weights kept as views of `kv_b_proj.weight`
//! (registered through it; the views dropped while it lives; it rebound under them), and
//! a plain list of LoRA scalings shifted by a delete.

use super::*;
use crate::scenarios::mla::{
    Absorbed, KV_B_PROJ, KV_LORA_RANK, MLA_DESCRIPTION, QK_NOPE, V_HEAD, W_UK_T, W_UV,
    mla_model_with,
};

const VIEWS: &str = "Here kv_b_proj is unquantized, and process_weights_after_loading \
    absorbs it without a copy: W_UK_T and W_UV are views into kv_b_proj.weight's storage \
    (`.T`, `.view`, `.split`, `.permute` / `.transpose`), held as plain attributes. Sleep \
    and an in-place reload restore their bytes through the parameter, so they count as \
    registered through it: no unregistered finding.";

pub(super) fn mla_views_dropped() -> Scenario {
    let (mut doc, _, _) = mla_model_with(Absorbed::Views);
    let manifest = doc.manifest();
    // The layerwise reload copies kv_b_proj.weight in place; the absorbed views are deleted
    // to be derived again at the next forward. Their bytes stay where the graphs read them,
    // in the parameter's storage, now with the new weights.
    reload_parameters_in_place(&mut doc, false);
    doc.remove_owner(W_UK_T);
    doc.remove_owner(W_UV);
    let live = doc.live(&manifest, RELOAD, Contents::Updated);
    Scenario {
        name: "mla_views_dropped",
        description: format!(
            "{MLA_DESCRIPTION} {VIEWS} reload_weights() copies the parameters in place and \
             deletes both views: their owner paths no longer resolve, but kv_b_proj.weight \
             still holds the bytes the graphs read, refreshed in place. Identity follows the \
             storage, not the owner path: no finding (a dropped view whose base lives; \
             PyTorch's liveness check agrees)."
        ),
        models: "vllm#48251, the absorbed weights as views",
        manifest,
        live: Some(live),
        allow: None,
        explain: vec![W_UV.into(), KV_B_PROJ.into()],
        // Each view: its path is gone, but kv_b_proj.weight held its storage at capture and
        // holds the same storage now (a carrier): not vanished, and the address lies in the
        // carrier's tensor, so not reused. Registered through kv_b_proj.weight, which was not
        // rebound: not unregistered, not drifted.
        expect: expect(vec![]),
    }
}

pub(super) fn mla_views_rebound_base() -> Scenario {
    let (mut doc, _, _) = mla_model_with(Absorbed::Views);
    let manifest = doc.manifest();
    // The reload replaces kv_b_proj.weight by a new Parameter (`replace_parameter` after
    // loading) and copies the new weights there; the absorbed views are not derived again and
    // keep the old storage alive: the graphs read the old weights.
    reload_parameters_in_place(&mut doc, false);
    let heads = crate::model::HEADS;
    let kv_b_new = fresh(&mut doc, BF16, &[heads * (QK_NOPE + V_HEAD), KV_LORA_RANK]);
    doc.rebind(KV_B_PROJ, kv_b_new);
    let live = doc.live(&manifest, RELOAD, Contents::Updated);
    Scenario {
        name: "mla_views_rebound_base",
        description: format!(
            "{MLA_DESCRIPTION} {VIEWS} reload_weights() replaces kv_b_proj.weight by a new \
             Parameter holding the new weights, but does not derive W_UK_T and W_UV again: \
             they keep the old storage alive, so nothing is freed, yet the graphs go on \
             reading the old weights. A view is registered only as long as the parameter it \
             is registered through still holds its storage."
        ),
        models: "vllm#48251, a rebound parameter under its views",
        manifest,
        live: Some(live),
        allow: None,
        explain: vec![W_UK_T.into()],
        // Each view: its own path still holds the captured view (no vanished, reshaped or
        // stale), its storage is alive (no freed, no reused), but the parameter it is
        // registered through now holds another storage (drifted).
        expect: expect(vec![
            finding(Kind::Drifted, W_UK_T, BOTH),
            finding(Kind::Drifted, W_UV, BOTH),
        ]),
    }
}

const SCALINGS: &str = "runner.lora_manager.scalings";

fn scaling(i: usize) -> String {
    format!("{SCALINGS}[{i}]")
}

pub(super) fn lora_scalings_list_shift() -> Scenario {
    let mut doc = Doc::new();
    let model = Model::new(&mut doc, "model", VOCAB);
    let layer = Layer::new(&mut doc, "model.layers[0]", AttnOpts::default());
    let mlp = Mlp::new(&mut doc, "model.layers[0]", false);
    // One 0-dim float32 scaling per active adapter, in a plain list.
    let scalings: Vec<TensorId> = (0..3)
        .map(|i| {
            doc.held(
                &scaling(i),
                "list",
                Registration::Container,
                WEIGHTS,
                F32,
                &[],
            )
        })
        .collect();
    {
        let scalings = scalings.clone();
        capture(&mut doc, |doc, g, x| {
            model.embed(doc, g, x);
            layer.attention(doc, g, &model.inputs, x);
            mlp.launch(doc, g, x);
            // Each adapter's delta is scaled by its scaling before it is added.
            for &s in &scalings {
                doc.kernel(
                    g,
                    MUL_SCALAR_TENSOR,
                    [x.bs as u32 * 2, 1, 1],
                    [128, 1, 1],
                    &[
                        (1, TI_OUT, At::Raw(x.mlp_out)),
                        (1, TI_A, At::Raw(x.mlp_out)),
                        (1, TI_B, At::T(s)),
                    ],
                );
            }
            model.finish(doc, g, x);
        });
    }
    let manifest = doc.manifest();
    let gone_hex = hex_of(&manifest, &scaling(1));
    // `del scalings[1]`: adapter 2's tensor moves to index 1, adapter 1's is released.
    doc.rebind(&scaling(1), scalings[2]);
    doc.remove_owner(&scaling(2));
    doc.free(scalings[1]);
    let live = doc.live(
        &manifest,
        "remove_lora(1) (`del scalings[1]`, graphs kept)",
        Contents::Preserved,
    );
    Scenario {
        name: "lora_scalings_list_shift",
        description: "A bf16 decoder layer serving three LoRA adapters: the runner keeps each \
            adapter's scaling as a 0-dim float32 tensor in a plain list, and the graphs \
            (batch sizes 8 and 1) scale each adapter's delta by it. Removing adapter 1 \
            deletes scalings[1]: adapter 2's tensor shifts to index 1, unchanged at its \
            address, and adapter 1's tensor is released to the allocator. The graphs still \
            read all three addresses. Identity follows the storage: the shifted tensor is no \
            hazard, the released one is (PyTorch's liveness check reports it dead)."
            .into(),
        models: "PyTorch's CUDA-graph input-liveness cases, a list shifted by `del`",
        manifest,
        live: Some(live),
        allow: None,
        explain: vec![scaling(1), gone_hex],
        // scalings[2]'s path is gone, but scalings[1] now holds its tensor (same view and
        // storage, same digest, a path one index away): moved, no finding. scalings[1] now
        // holds another tensor (drifted) and its captured tensor is free (freed).
        // scalings[0] is unchanged. All three are list elements: unregistered.
        expect: expect(vec![
            finding(Kind::Drifted, &scaling(1), BOTH),
            finding(Kind::Freed, &scaling(1), BOTH),
            finding(Kind::Unregistered, &scaling(0), BOTH),
            finding(Kind::Unregistered, &scaling(1), BOTH),
            finding(Kind::Unregistered, &scaling(2), BOTH),
        ]),
    }
}
