//! Gemma3n scaling constants lost at sleep level 2 (vllm#29341).

use super::*;

const EMBED_SCALE: &str = "model.language_model.embed_scale";
const EMBED_SCALE_PER_LAYER: &str = "model.language_model.embed_scale_per_layer";
const PER_LAYER_PROJECTION_SCALE: &str = "model.language_model.per_layer_projection_scale";

pub(super) fn gemma3n_sleep2_stale() -> Scenario {
    let mut doc = Doc::new();
    let lm = "model.language_model";
    let model = Model::new(&mut doc, lm, 262_400);
    // Gemma3n E2B: 30 layers x 256 per-layer input dims.
    let per_layer = 30 * 256;
    let embed_per_layer = doc.param(
        &format!("{lm}.embed_tokens_per_layer.weight"),
        "VocabParallelEmbedding",
        BF16,
        &[262_144, per_layer],
    );
    let projection = doc.param(
        &format!("{lm}.per_layer_model_projection.weight"),
        "ColumnParallelLinear",
        BF16,
        &[per_layer, HIDDEN],
    );
    // Constants made in __init__ while the weights tag is active: two plain attributes and
    // one non-persistent buffer.
    let scalar = |doc: &mut Doc, path: &str, registration| {
        doc.held(path, "Gemma3nTextModel", registration, WEIGHTS, BF16, &[])
    };
    let embed_scale = scalar(&mut doc, EMBED_SCALE, Registration::ModuleAttribute);
    let embed_scale_pl = scalar(
        &mut doc,
        EMBED_SCALE_PER_LAYER,
        Registration::ModuleAttribute,
    );
    let proj_scale = scalar(
        &mut doc,
        PER_LAYER_PROJECTION_SCALE,
        Registration::BufferNonPersistent,
    );
    let layer = Layer::new(&mut doc, &format!("{lm}.layers[0]"), AttnOpts::default());
    let mlp = Mlp::new(&mut doc, &format!("{lm}.layers[0]"), false);
    capture(&mut doc, |doc, g, x| {
        let bs = x.bs;
        let mul = |doc: &mut Doc, data: u64, scale: TensorId| {
            doc.kernel(
                g,
                MUL_SCALAR_TENSOR,
                [bs as u32 * 2, 1, 1],
                [128, 1, 1],
                &[
                    (1, TI_OUT, At::Raw(data)),
                    (1, TI_A, At::Raw(data)),
                    (1, TI_B, At::T(scale)),
                ],
            )
        };
        model.embed(doc, g, x);
        mul(doc, x.hidden, embed_scale);
        let pl = doc.raw(GRAPH_POOL, bs * per_layer * 2);
        doc.kernel(
            g,
            crate::model::EMBED,
            [bs as u32, 1, 1],
            [128, 4, 1],
            &[
                (0, 0, At::Raw(pl)),
                (1, 0, At::T(embed_per_layer)),
                (2, 0, At::T(model.inputs.input_ids)),
            ],
        );
        mul(doc, pl, embed_scale_pl);
        let proj = doc.raw(GRAPH_POOL, bs * per_layer * 2);
        doc.kernel(
            g,
            nvjet(bs),
            [60, bs.div_ceil(8) as u32, 1],
            [384, 1, 1],
            &[
                (0, NVJET_A, At::T(projection)),
                (0, NVJET_B, At::Raw(x.hidden)),
                (0, NVJET_C, At::Raw(proj)),
                (0, NVJET_D, At::Raw(proj)),
            ],
        );
        mul(doc, proj, proj_scale);
        layer.attention(doc, g, &model.inputs, x);
        mlp.launch(doc, g, x);
        model.finish(doc, g, x);
    });
    let manifest = doc.manifest();
    // Sleep level 2 discards the weights pool; wake maps it again at the same virtual
    // addresses; reload_weights() of the same checkpoint refills the parameters and vLLM
    // restores the buffers it saved. The two plain attributes come back as zero pages.
    doc.get_mut(embed_scale).digest = Some(zero_digest());
    doc.get_mut(embed_scale_pl).digest = Some(zero_digest());
    let live = doc.live(
        &manifest,
        "sleep(level=2) + wake_up() + reload_weights()",
        Contents::Preserved,
    );
    Scenario {
        name: "gemma3n_sleep2_stale",
        description: "A Gemma3n-style text model: the token embedding is scaled by embed_scale, \
            the per-layer embedding by embed_scale_per_layer and the per-layer projection by \
            per_layer_projection_scale, each a 0-dim bf16 tensor that a TensorIterator \
            elementwise kernel reads through its by-value closure (nonzero offsets), followed \
            by a standard attention + MLP layer; graphs for batch sizes 8 and 1. The two \
            scales are plain module attributes, per_layer_projection_scale a non-persistent \
            buffer, all in the weights pool. The engine sleeps at level 2, wakes and reloads \
            the same weights (contents preserved): every address is unchanged and the \
            parameters' and buffers' digests match, but the plain attributes were not \
            restored and read as zeros: silent wrong output (vllm#29341, Gemma3n embed_scale)."
            .into(),
        models: "vllm#29341, Gemma3n embed_scale",
        manifest,
        live: Some(live),
        allow: None,
        explain: vec![EMBED_SCALE.into(), "--kernel MulFunctor".into()],
        // The two plain attributes: same address and layout, preserved event, digests differ
        // (stale), module attributes (unregistered). The buffer and the parameters match.
        expect: planned(
            expect(vec![
                finding(Kind::Stale, EMBED_SCALE, BOTH),
                finding(Kind::Stale, EMBED_SCALE_PER_LAYER, BOTH),
                finding(Kind::Unregistered, EMBED_SCALE, BOTH),
                finding(Kind::Unregistered, EMBED_SCALE_PER_LAYER, BOTH),
            ]),
            &[],
            BOTH,
        ),
    }
}
