//! The Marlin workspace and `g_idx_sort_indices` rebuilt by a reload (vllm#48438).

use super::*;

const MARLIN_PERMUTE: &str =
    "marlin::permute_cols_kernel(int4 const*, int const*, int4*, int, int, int, int)";
const MARLIN: &str = "void marlin::Marlin<__nv_bfloat16, 2305843009213693952l, 256, 1, 8, 8, true, 4, 8, false>(int4 const*, int4 const*, int4*, int4*, int4 const*, int4 const*, unsigned short const*, int4 const*, int const*, int, int, int, int, int, int*, bool, bool, bool, int)";

pub(super) fn marlin_workspace_rebuilt() -> Scenario {
    let mut doc = Doc::new();
    let model = Model::new(&mut doc, "model", VOCAB);
    let layer = Layer::new(&mut doc, "model.layers[0]", AttnOpts::default());
    let gu = "model.layers[0].mlp.gate_up_proj";
    let holder = "MergedColumnParallelLinear";
    let n = 2 * crate::model::INTERMEDIATE;
    // GPTQ int4, group size 128, act-order, repacked for Marlin.
    let qweight = doc.param(&format!("{gu}.qweight"), holder, I32, &[HIDDEN / 16, n * 2]);
    let scales = doc.param(&format!("{gu}.scales"), holder, BF16, &[HIDDEN / 128, n]);
    let g_idx = doc.param(&format!("{gu}.g_idx"), holder, I32, &[HIDDEN]);
    let down = crate::model::Linear::bf16(
        &mut doc,
        "model.layers[0].mlp.down_proj",
        "RowParallelLinear",
        HIDDEN,
        crate::model::INTERMEDIATE,
    );
    // process_weights_after_loading: a plain attribute on the layer, and the lock
    // workspace on the kernel object (132 SMs x 4 blocks).
    let sort_path = format!("{gu}.g_idx_sort_indices");
    let ws_path = format!("{gu}.quant_method.kernel.workspace");
    let sort = doc.held(
        &sort_path,
        holder,
        Registration::ModuleAttribute,
        WEIGHTS,
        I32,
        &[HIDDEN],
    );
    let ws = doc.held(
        &ws_path,
        "MarlinLinearKernel",
        Registration::ObjectAttribute,
        WEIGHTS,
        I32,
        &[132 * 4],
    );
    doc.site(
        ws,
        &[
            (
                "vllm/model_executor/layers/quantization/utils/marlin_utils.py",
                173,
                "marlin_make_workspace_new",
            ),
            (
                "vllm/model_executor/layers/quantization/kernels/mixed_precision/marlin.py",
                112,
                "process_weights_after_loading",
            ),
        ],
    );
    capture(&mut doc, |doc, g, x| {
        model.embed(doc, g, x);
        layer.attention(doc, g, &model.inputs, x);
        let a_tmp = doc.raw(GRAPH_POOL, x.bs * HIDDEN * 2);
        doc.kernel(
            g,
            MARLIN_PERMUTE,
            [x.bs as u32, 1, 1],
            [256, 1, 1],
            &[
                (0, 0, At::Raw(x.attn_proj)),
                (1, 0, At::T(sort)),
                (2, 0, At::Raw(a_tmp)),
            ],
        );
        let out = doc.raw(GRAPH_POOL, x.bs * n * 2);
        let c_tmp = doc.raw(GRAPH_POOL, 132 * 4 * 16 * 64 * 4);
        doc.kernel(
            g,
            MARLIN,
            [132, 1, 1],
            [256, 1, 1],
            &[
                (0, 0, At::Raw(a_tmp)),
                (1, 0, At::T(qweight)),
                (2, 0, At::Raw(out)),
                (3, 0, At::Raw(c_tmp)),
                (5, 0, At::T(scales)),
                (8, 0, At::T(g_idx)),
                (14, 0, At::T(ws)),
            ],
        );
        let act = silu_and_mul(doc, g, x.bs, out);
        down.launch(doc, g, x.bs, act, x.mlp_out);
        model.finish(doc, g, x);
    });
    let manifest = doc.manifest();

    // The layerwise reload restores qweight, scales and g_idx in place, then re-runs
    // process_weights_after_loading: a new workspace on the kernel object and a new
    // g_idx_sort_indices on the layer. Nothing holds the old ones; their blocks go back to
    // the allocator's free list.
    reload_parameters_in_place(&mut doc, false);
    let sort2 = fresh(&mut doc, I32, &[HIDDEN]);
    doc.rebind(&sort_path, sort2);
    let ws2 = fresh(&mut doc, I32, &[132 * 4]);
    doc.rebind(&ws_path, ws2);
    doc.free(sort);
    doc.free(ws);
    let live = doc.live(&manifest, RELOAD, Contents::Updated);

    Scenario {
        name: "marlin_workspace_rebuilt",
        description: "A GPTQ int4 act-order model whose MLP gate_up_proj runs through vLLM's \
            MarlinLinearKernel: marlin::permute_cols_kernel reorders the activations by \
            g_idx_sort_indices (a plain attribute process_weights_after_loading sets on the \
            layer), then marlin::Marlin reads qweight, scales and g_idx (parameters) and uses \
            the kernel object's workspace as its lock array. Graphs for batch sizes 8 and 1 \
            share one pool. reload_weights() copies the parameters back in place but re-runs \
            process_weights_after_loading, which allocates a new workspace and a new \
            g_idx_sort_indices; the old blocks are freed, so the graphs' lock array now sits \
            in free memory (the livelock of vllm#48438)."
            .into(),
        models: "vllm#48438",
        manifest,
        live: Some(live),
        allow: None,
        explain: vec![
            ws_path.clone(),
            sort_path.clone(),
            "--kernel marlin::Marlin".into(),
        ],
        // Both plain-attribute tensors: rebound (drifted), old block free (freed), reachable
        // only through a module attribute / object attribute (unregistered). The parameters
        // stay in place with updated contents and no reference digest: nothing.
        expect: planned(
            expect(vec![
                finding(Kind::Drifted, &sort_path, BOTH),
                finding(Kind::Drifted, &ws_path, BOTH),
                finding(Kind::Freed, &sort_path, BOTH),
                finding(Kind::Freed, &ws_path, BOTH),
                finding(Kind::Unregistered, &sort_path, BOTH),
                finding(Kind::Unregistered, &ws_path, BOTH),
            ]),
            BOTH,
            &[],
        ),
    }
}
