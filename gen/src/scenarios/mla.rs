//! MLA absorbed weights `W_UK_T` / `W_UV` kept as plain attributes (vllm#48251).

use super::*;

pub(super) const KV_LORA_RANK: u64 = 512;
pub(super) const QK_NOPE: u64 = 128;
const QK_ROPE: u64 = 64;
pub(super) const V_HEAD: u64 = 128;
const MLA_BLOCK: u64 = 64;
const CONCAT_AND_CACHE_MLA: &str = "void vllm::concat_and_cache_mla_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>(__nv_bfloat16 const*, __nv_bfloat16 const*, __nv_bfloat16*, long const*, int, int, int, int, int, int, float const*)";
const CAT: &str = "void at::native::(anonymous namespace)::CatArrayBatchedCopy_contig<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 3, 64, 64>(at::native::(anonymous namespace)::OpaqueType<2u>*, at::native::(anonymous namespace)::CatArrInputTensorMetadata<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 64, 64>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, unsigned int)";
const FLASH_MLA: &str = "void flash::flash_fwd_splitkv_mla_kernel<Flash_fwd_kernel_traits_mla<576, 64, 64, 8, cutlass::bfloat16_t, 512>, true>(Flash_fwd_mla_params)";
const FLASH_MLA_COMBINE: &str = "void flash::flash_fwd_splitkv_mla_combine_kernel<cutlass::bfloat16_t, 512, 8>(Flash_fwd_mla_params)";
/// Offsets in `Flash_fwd_mla_params` (param 0).
const FM_Q: u32 = 0x30;
const FM_K: u32 = 0x38;
const FM_O: u32 = 0x48;
const FM_LSE: u32 = 0x50;
const FM_SEQLENS_K: u32 = 0x60;
const FM_BLOCK_TABLE: u32 = 0x78;
const FM_OACCUM: u32 = 0x98;
const FM_LSEACCUM: u32 = 0xa0;
const FM_TILE_META: u32 = 0xb0;
const FM_NUM_SPLITS: u32 = 0xb8;

pub(super) const W_UK_T: &str = "model.layers[0].self_attn.mla_attn.W_UK_T";
pub(super) const W_UV: &str = "model.layers[0].self_attn.mla_attn.W_UV";
pub(super) const KV_B_PROJ: &str = "model.layers[0].self_attn.kv_b_proj.weight";

/// How `process_weights_after_loading` makes the absorbed weights.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Absorbed {
    /// New contiguous tensors (the quantized and the older paths).
    Copies,
    /// Views of the unquantized `kv_b_proj.weight`: `.T`, `.view(rank, heads, nope + v)`,
    /// `.split`, then `.permute(1, 2, 0)` and `.transpose(0, 1)`; no copy.
    Views,
}

/// A DeepSeek-V2-Lite-style MLA decoder layer on FlashMLA, captured at both batch sizes.
/// Returns the process and the two absorbed weights.
fn mla_model() -> (Doc, TensorId, TensorId) {
    mla_model_with(Absorbed::Copies)
}

/// [`mla_model`] with the absorbed weights made as `absorbed` says.
pub(super) fn mla_model_with(absorbed: Absorbed) -> (Doc, TensorId, TensorId) {
    let mut doc = Doc::new();
    let model = Model::new(&mut doc, "model", 102_400);
    let a = "model.layers[0].self_attn";
    let input_layernorm = doc.param(
        "model.layers[0].input_layernorm.weight",
        "RMSNorm",
        BF16,
        &[HIDDEN],
    );
    let q_out = crate::model::HEADS * (QK_NOPE + QK_ROPE);
    let q_proj = doc.param(
        &format!("{a}.q_proj.weight"),
        "ColumnParallelLinear",
        BF16,
        &[q_out, HIDDEN],
    );
    let kv_a = doc.param(
        &format!("{a}.kv_a_proj_with_mqa.weight"),
        "ReplicatedLinear",
        BF16,
        &[KV_LORA_RANK + QK_ROPE, HIDDEN],
    );
    let kv_a_norm = doc.param(
        &format!("{a}.kv_a_layernorm.weight"),
        "RMSNorm",
        BF16,
        &[KV_LORA_RANK],
    );
    // Read only by prefill, which is not captured: owned but never touched.
    let kv_b = doc.param(
        &format!("{a}.kv_b_proj.weight"),
        "ColumnParallelLinear",
        BF16,
        &[crate::model::HEADS * (QK_NOPE + V_HEAD), KV_LORA_RANK],
    );
    let o_proj = doc.param(
        &format!("{a}.o_proj.weight"),
        "RowParallelLinear",
        BF16,
        &[HIDDEN, crate::model::HEADS * V_HEAD],
    );
    let cos_sin = doc.held(
        &format!("{a}.rotary_emb.cos_sin_cache"),
        "DeepseekScalingRotaryEmbedding",
        Registration::BufferNonPersistent,
        WEIGHTS,
        BF16,
        &[MAX_POSITIONS, QK_ROPE],
    );
    let post_norm = doc.param(
        "model.layers[0].post_attention_layernorm.weight",
        "RMSNorm",
        BF16,
        &[HIDDEN],
    );
    let mlp = Mlp::new(&mut doc, "model.layers[0]", false);
    let kv_cache = doc.held(
        &format!("{a}.mla_attn.kv_cache[0]"),
        "list",
        Registration::RuntimeState,
        crate::doc::KV_CACHE,
        BF16,
        &[crate::model::KV_BLOCKS, MLA_BLOCK, KV_LORA_RANK + QK_ROPE],
    );
    let builder = crate::model::FI_BUILDER;
    let tile_meta = doc.held(
        &format!("{builder}.cg_buf_tile_scheduler_metadata"),
        "FlashMLAMetadataBuilder",
        Registration::GraphInput,
        crate::doc::DEFAULT,
        I32,
        &[132, 8],
    );
    let num_splits = doc.held(
        &format!("{builder}.cg_buf_num_splits"),
        "FlashMLAMetadataBuilder",
        Registration::GraphInput,
        crate::doc::DEFAULT,
        I32,
        &[crate::model::MAX_BATCH + 1],
    );
    // MLAAttention.process_weights_after_loading: kv_b_proj split and absorbed into two
    // plain attributes of the attention layer (vllm#48251).
    let heads = crate::model::HEADS;
    let (w_uk_t, w_uv) = match absorbed {
        Absorbed::Copies => (
            doc.held(
                W_UK_T,
                "MLAAttention",
                Registration::ModuleAttribute,
                WEIGHTS,
                BF16,
                &[heads, QK_NOPE, KV_LORA_RANK],
            ),
            doc.held(
                W_UV,
                "MLAAttention",
                Registration::ModuleAttribute,
                WEIGHTS,
                BF16,
                &[heads, KV_LORA_RANK, V_HEAD],
            ),
        ),
        Absorbed::Views => {
            // kv_b_proj.weight is [heads * (nope + v), rank], row-major: element (h, j, r)
            // of the split view sits at (h * (nope + v) + j) * rank + r.
            let (rank, row) = (KV_LORA_RANK as i64, (QK_NOPE + V_HEAD) as i64);
            let uk = doc.view(
                kv_b,
                0,
                &[heads, QK_NOPE, KV_LORA_RANK],
                &[row * rank, rank, 1],
            );
            let uv = doc.view(
                kv_b,
                QK_NOPE * KV_LORA_RANK * 2,
                &[heads, KV_LORA_RANK, V_HEAD],
                &[row * rank, 1, rank],
            );
            doc.own(W_UK_T, uk, Registration::ModuleAttribute, "MLAAttention");
            doc.own(W_UV, uv, Registration::ModuleAttribute, "MLAAttention");
            (uk, uv)
        }
    };
    let inputs = model.inputs;
    capture(&mut doc, |doc, g, x| {
        let bs = x.bs;
        let gemm = |doc: &mut Doc, w: TensorId, b: u64, d: u64| {
            doc.kernel(
                g,
                nvjet(bs),
                [16, bs.div_ceil(8) as u32, heads as u32],
                [384, 1, 1],
                &[
                    (0, NVJET_A, At::T(w)),
                    (0, NVJET_B, At::Raw(b)),
                    (0, NVJET_C, At::Raw(d)),
                    (0, NVJET_D, At::Raw(d)),
                ],
            )
        };
        model.embed(doc, g, x);
        doc.kernel(
            g,
            RMS_NORM,
            [bs as u32, 1, 1],
            [256, 1, 1],
            &[
                (0, 0, At::Raw(x.normed)),
                (1, 0, At::Raw(x.hidden)),
                (3, 0, At::T(input_layernorm)),
            ],
        );
        let q = doc.raw(GRAPH_POOL, bs * q_out * 2);
        gemm(doc, q_proj, x.normed, q);
        let kv_c = doc.raw(GRAPH_POOL, bs * (KV_LORA_RANK + QK_ROPE) * 2);
        gemm(doc, kv_a, x.normed, kv_c);
        let kv_c_normed = doc.raw(GRAPH_POOL, bs * KV_LORA_RANK * 2);
        doc.kernel(
            g,
            RMS_NORM,
            [bs as u32, 1, 1],
            [256, 1, 1],
            &[
                (0, 0, At::Raw(kv_c_normed)),
                (1, 0, At::Raw(kv_c)),
                (3, 0, At::T(kv_a_norm)),
            ],
        );
        let q_pe = q + QK_NOPE * 2;
        let k_pe = kv_c + KV_LORA_RANK * 2;
        doc.kernel(
            g,
            ROTARY,
            [bs as u32, 1, 1],
            [512, 1, 1],
            &[
                (0, 0, At::T(inputs.positions)),
                (1, 0, At::Raw(q_pe)),
                (2, 0, At::Raw(k_pe)),
                (3, 0, At::T(cos_sin)),
            ],
        );
        doc.kernel(
            g,
            CONCAT_AND_CACHE_MLA,
            [bs as u32, 1, 1],
            [512, 1, 1],
            &[
                (0, 0, At::Raw(kv_c_normed)),
                (1, 0, At::Raw(k_pe)),
                (2, 0, At::T(kv_cache)),
                (3, 0, At::T(inputs.slot_mapping)),
            ],
        );
        // q_nope @ W_UK_T: the absorbed query in latent space.
        let ql_nope = doc.raw(GRAPH_POOL, bs * heads * KV_LORA_RANK * 2);
        gemm(doc, w_uk_t, q, ql_nope);
        let decode_q = doc.raw(GRAPH_POOL, bs * heads * (KV_LORA_RANK + QK_ROPE) * 2);
        doc.kernel(
            g,
            CAT,
            [bs as u32, 2, 1],
            [128, 1, 1],
            &[
                (0, 0, At::Raw(decode_q)),
                (1, 0, At::Raw(ql_nope)),
                (1, 8, At::Raw(q_pe)),
            ],
        );
        let o_latent = doc.raw(GRAPH_POOL, bs * heads * KV_LORA_RANK * 2);
        let lse = doc.raw(GRAPH_POOL, bs * heads * 4);
        let oaccum = doc.raw(GRAPH_POOL, (bs + 132) * heads * KV_LORA_RANK * 4);
        let lseaccum = doc.raw(GRAPH_POOL, (bs + 132) * heads * 4);
        let mla_params = [
            (0, FM_Q, At::Raw(decode_q)),
            (0, FM_K, At::T(kv_cache)),
            (0, FM_O, At::Raw(o_latent)),
            (0, FM_LSE, At::Raw(lse)),
            (0, FM_SEQLENS_K, At::T(inputs.seq_lens)),
            (0, FM_BLOCK_TABLE, At::T(inputs.block_table)),
            (0, FM_OACCUM, At::Raw(oaccum)),
            (0, FM_LSEACCUM, At::Raw(lseaccum)),
            (0, FM_TILE_META, At::T(tile_meta)),
            (0, FM_NUM_SPLITS, At::T(num_splits)),
        ];
        doc.kernel(g, FLASH_MLA, [132, 1, 1], [256, 1, 1], &mla_params);
        doc.kernel(
            g,
            FLASH_MLA_COMBINE,
            [bs as u32, heads as u32, 1],
            [128, 1, 1],
            &mla_params,
        );
        // o_latent @ W_UV: back from latent space to per-head values.
        gemm(doc, w_uv, o_latent, x.attn_out);
        gemm(doc, o_proj, x.attn_out, x.attn_proj);
        doc.kernel(
            g,
            FUSED_ADD_RMS_NORM,
            [bs as u32, 1, 1],
            [256, 1, 1],
            &[
                (0, 0, At::Raw(x.attn_proj)),
                (2, 0, At::Raw(x.hidden)),
                (3, 0, At::T(post_norm)),
            ],
        );
        mlp.launch(doc, g, x);
        model.finish(doc, g, x);
    });
    (doc, w_uk_t, w_uv)
}

pub(super) const MLA_DESCRIPTION: &str = "A DeepSeek-V2-Lite-style MLA decoder layer on FlashMLA, \
    captured at batch sizes 8 and 1 into one pool: q_proj and kv_a_proj_with_mqa GEMMs, \
    kv_a_layernorm, RoPE, concat_and_cache_mla into the latent KV cache, the absorbed-query \
    GEMM with W_UK_T, FlashMLA (by-value Flash_fwd_mla_params, metadata buffers as graph \
    inputs), the W_UV GEMM back to per-head values, o_proj, then a bf16 SiLU MLP. \
    MLAAttention.process_weights_after_loading splits kv_b_proj.weight (read only by prefill, \
    so owned but untouched here) into W_UK_T and W_UV and keeps them as plain attributes of \
    the attention module, which parameter copy-back, sleep level 2 and the CI oracle do not \
    see (vllm#48251).";

pub(super) fn mla_wuv_plain_attrs() -> Scenario {
    let (doc, _, _) = mla_model();
    let manifest = doc.manifest();
    Scenario {
        name: "mla_wuv_plain_attrs",
        description: format!(
            "{MLA_DESCRIPTION} Capture only: the manifest alone already shows both absorbed \
             weights as unregistered."
        ),
        models: "vllm#48251",
        manifest,
        live: None,
        allow: None,
        explain: vec![W_UV.into(), "--kernel flash_fwd_splitkv_mla_kernel".into()],
        // Capture-time checks only. W_UK_T and W_UV: module attributes, persistent, none
        // registered. Everything else is a parameter, buffer, graph input, runtime state or
        // graph-pool intermediate.
        expect: expect(vec![
            finding(Kind::Unregistered, W_UK_T, BOTH),
            finding(Kind::Unregistered, W_UV, BOTH),
        ]),
    }
}

pub(super) fn mla_wuv_reload_drifted() -> Scenario {
    let (mut doc, w_uk_t, w_uv) = mla_model();
    let manifest = doc.manifest();
    let w_uv_hex = hex_of(&manifest, W_UV);
    // Reload of new weights: parameters copied back in place; process_weights_after_loading
    // absorbs the new kv_b_proj into new W_UK_T / W_UV tensors and rebinds the attributes.
    // The old ones go back to the allocator's free list (mapped, not handed out yet).
    reload_parameters_in_place(&mut doc, false);
    let heads = crate::model::HEADS;
    let uk2 = fresh(&mut doc, BF16, &[heads, QK_NOPE, KV_LORA_RANK]);
    let uv2 = fresh(&mut doc, BF16, &[heads, KV_LORA_RANK, V_HEAD]);
    doc.rebind(W_UK_T, uk2);
    doc.rebind(W_UV, uv2);
    doc.free(w_uk_t);
    doc.free(w_uv);
    let live = doc.live(&manifest, RELOAD, Contents::Updated);
    Scenario {
        name: "mla_wuv_reload_drifted",
        description: format!(
            "{MLA_DESCRIPTION} reload_weights() with new weights copies the parameters back in \
             place but re-runs the absorption, rebinding W_UK_T and W_UV to new tensors; the \
             graphs keep reading the old blocks, now free in the allocator's cache: wrong \
             output rather than a crash."
        ),
        models: "vllm#48251",
        manifest,
        live: Some(live),
        allow: None,
        explain: vec![W_UK_T.into(), w_uv_hex],
        // Each absorbed weight: rebound (drifted), old block free (freed), module attribute
        // (unregistered, a capture-time check that also runs with a live snapshot).
        expect: expect(vec![
            finding(Kind::Drifted, W_UK_T, BOTH),
            finding(Kind::Drifted, W_UV, BOTH),
            finding(Kind::Freed, W_UK_T, BOTH),
            finding(Kind::Freed, W_UV, BOTH),
            finding(Kind::Unregistered, W_UK_T, BOTH),
            finding(Kind::Unregistered, W_UV, BOTH),
        ]),
    }
}
