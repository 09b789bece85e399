//! Mixture-of-experts scenarios: CUTLASS stride arrays with an alias (vllm#41670), input
//! scales set to `None` (vanished), and a scratch buffer only one graph reads (vllm#48902).

use super::*;
use crate::doc::Dtype;

const ROUTER_TOPK: &str = "void vllm::moe::topkGatingSoftmax<8, 8, 4, 16, 32, int, c10::BFloat16>(c10::BFloat16 const*, bool const*, float*, int, int*, int*, int, int, int, bool)";
const COMPUTE_PROBLEM_SIZES: &str =
    "void vllm::compute_problem_sizes(int const*, int*, int*, int*, int, int, int, int)";
const COMPUTE_EXPERT_OFFSETS: &str =
    "void vllm::compute_expert_offsets(int const*, int*, int*, int)";
const DYNAMIC_FP8_QUANT: &str = "void vllm::dynamic_per_token_scaled_fp8_quant_kernel<c10::BFloat16, c10::Float8_e4m3fn, true>(c10::Float8_e4m3fn*, float*, c10::BFloat16 const*, float const*, int)";
const SHUFFLE_ROWS: &str = "void vllm::shuffleInputRowsKernel<unsigned char>(unsigned char const*, int const*, unsigned char*, long, long)";
const GROUP_GEMM_STARTS: &str = "void vllm::__get_group_gemm_starts<cutlass::float_e4m3_t, cutlass::bfloat16_t, float>(long*, cutlass::float_e4m3_t**, cutlass::float_e4m3_t**, cutlass::bfloat16_t**, float**, float**, cutlass::float_e4m3_t*, cutlass::float_e4m3_t*, cutlass::bfloat16_t*, float*, float*, int, int, bool, bool)";
const CUTLASS_MOE_MM: &str = "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int> >, cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm90ArrayTmaGmmaWarpSpecialized<5, cute::tuple<cute::C<1>, cute::C<2>, cute::C<1> >, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum>, cute::tuple<cute::C<128>, cute::C<256>, cute::C<128> >, cutlass::float_e4m3_t, cute::tuple<long, cute::C<1>, cute::C<0> >*, cutlass::float_e4m3_t, cute::tuple<long, cute::C<1>, cute::C<0> >*>, cutlass::epilogue::collective::CollectiveEpilogue<cutlass::epilogue::Sm90PtrArrayTmaWarpSpecialized<4, 2, 16, true, false>, cutlass::bfloat16_t, cute::tuple<long, cute::C<1>, cute::C<0> >*> > >(cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int> > >::Params)";
const MOE_SUM: &str =
    "void vllm::moe::moe_sum_kernel<c10::BFloat16, 2>(c10::BFloat16*, c10::BFloat16 const*, int)";
/// Offsets in the grouped GEMM's `Params`: problem shapes, per-expert pointer arrays and
/// the stride arrays `ab_strides*` / `c_strides*` (one stride per expert).
const MM_PROBLEMS: u32 = 0x10;
const MM_PTR_A: u32 = 0x28;
const MM_STRIDE_A: u32 = 0x30;
const MM_PTR_B: u32 = 0x38;
const MM_STRIDE_B: u32 = 0x40;
const MM_PTR_C: u32 = 0x98;
const MM_STRIDE_C: u32 = 0xa0;
const MM_PTR_D: u32 = 0xa8;
const MM_STRIDE_D: u32 = 0xb0;
const MM_ALPHA_A: u32 = 0xd0;
const MM_ALPHA_B: u32 = 0xd8;

const EXPERTS: u64 = 8;
const TOPK: u64 = 2;
const MOE_INTERMEDIATE: u64 = 768;

/// Where the MoE scenarios' experts live.
const EXPERTS_PATH: &str = "model.layers[0].mlp.experts";

/// The router gate and the expert weights of layer 0, declared in the order every MoE
/// scenario uses (so their addresses agree across scenarios).
struct MoeWeights {
    gate: TensorId,
    w13: TensorId,
    w2: TensorId,
}

fn moe_weights(doc: &mut Doc, dtype: Dtype) -> MoeWeights {
    let gate = doc.param(
        "model.layers[0].mlp.gate.weight",
        "ReplicatedLinear",
        BF16,
        &[EXPERTS, HIDDEN],
    );
    let e = EXPERTS_PATH;
    let w13 = doc.param(
        &format!("{e}.w13_weight"),
        "FusedMoE",
        dtype,
        &[EXPERTS, 2 * MOE_INTERMEDIATE, HIDDEN],
    );
    let w2 = doc.param(
        &format!("{e}.w2_weight"),
        "FusedMoE",
        dtype,
        &[EXPERTS, HIDDEN, MOE_INTERMEDIATE],
    );
    MoeWeights { gate, w13, w2 }
}

/// The per-expert fp8 weight scales.
fn fp8_weight_scales(doc: &mut Doc) -> (TensorId, TensorId) {
    let e = EXPERTS_PATH;
    let w13 = doc.param(
        &format!("{e}.w13_weight_scale"),
        "FusedMoE",
        F32,
        &[EXPERTS],
    );
    let w2 = doc.param(&format!("{e}.w2_weight_scale"), "FusedMoE", F32, &[EXPERTS]);
    (w13, w2)
}

pub(super) fn cutlass_moe_strides_alias() -> Scenario {
    cutlass_moe(false)
}

pub(super) fn cutlass_moe_alias_split() -> Scenario {
    cutlass_moe(true)
}

/// The CUTLASS MoE layer and its reload; `split`: the new object's ab_strides1 is a new
/// tensor while c_strides2 keeps the captured one (the alias is broken).
fn cutlass_moe(split: bool) -> Scenario {
    let mut doc = Doc::new();
    let model = Model::new(&mut doc, "model", VOCAB);
    let layer = Layer::new(&mut doc, "model.layers[0]", AttnOpts::default());
    let e = EXPERTS_PATH;
    let MoeWeights { gate, w13, w2 } = moe_weights(&mut doc, FP8);
    let (w13_scale, w2_scale) = fp8_weight_scales(&mut doc);
    // CutlassExpertsFp8.__init__ (from process_weights_after_loading): four stride
    // arrays, c_strides2 the same tensor as ab_strides1 (both hold K per expert).
    let fe = format!("{e}.quant_method.moe_kernel.fused_experts");
    let ab1_path = format!("{fe}.ab_strides1");
    let c1_path = format!("{fe}.c_strides1");
    let ab2_path = format!("{fe}.ab_strides2");
    let c2_path = format!("{fe}.c_strides2");
    let obj = Registration::ObjectAttribute;
    let ab1 = doc.held(
        &ab1_path,
        "CutlassExpertsFp8",
        obj,
        WEIGHTS,
        I64,
        &[EXPERTS],
    );
    let c1 = doc.held(&c1_path, "CutlassExpertsFp8", obj, WEIGHTS, I64, &[EXPERTS]);
    let ab2 = doc.held(
        &ab2_path,
        "CutlassExpertsFp8",
        obj,
        WEIGHTS,
        I64,
        &[EXPERTS],
    );
    doc.own(&c2_path, ab1, obj, "CutlassExpertsFp8");

    capture(&mut doc, |doc, g, x| {
        let bs = x.bs;
        let rows = bs * TOPK;
        model.embed(doc, g, x);
        layer.attention(doc, g, &model.inputs, x);
        let logits = doc.raw(GRAPH_POOL, bs * EXPERTS * 2);
        doc.kernel(
            g,
            nvjet(bs),
            [1, 1, 1],
            [384, 1, 1],
            &[
                (0, NVJET_A, At::T(gate)),
                (0, NVJET_B, At::Raw(x.attn_proj)),
                (0, NVJET_C, At::Raw(logits)),
                (0, NVJET_D, At::Raw(logits)),
            ],
        );
        let topk_weights = doc.raw(GRAPH_POOL, rows * 4);
        let topk_ids = doc.raw(GRAPH_POOL, rows * 4);
        doc.kernel(
            g,
            ROUTER_TOPK,
            [bs.div_ceil(4) as u32, 1, 1],
            [32, 4, 1],
            &[
                (0, 0, At::Raw(logits)),
                (2, 0, At::Raw(topk_weights)),
                (4, 0, At::Raw(topk_ids)),
            ],
        );
        let offsets = doc.raw(GRAPH_POOL, (EXPERTS + 1) * 4);
        let sizes1 = doc.raw(GRAPH_POOL, EXPERTS * 3 * 4);
        let sizes2 = doc.raw(GRAPH_POOL, EXPERTS * 3 * 4);
        let a_map = doc.raw(GRAPH_POOL, rows * 4);
        doc.memset(g, At::Raw(offsets));
        doc.kernel(
            g,
            COMPUTE_PROBLEM_SIZES,
            [EXPERTS as u32, 1, 1],
            [256, 1, 1],
            &[
                (0, 0, At::Raw(topk_ids)),
                (1, 0, At::Raw(sizes1)),
                (2, 0, At::Raw(sizes2)),
                (3, 0, At::Raw(a_map)),
            ],
        );
        doc.kernel(
            g,
            COMPUTE_EXPERT_OFFSETS,
            [1, 1, 1],
            [1, 1, 1],
            &[(0, 0, At::Raw(sizes1)), (1, 0, At::Raw(offsets))],
        );
        let grouped = |doc: &mut Doc,
                       input: u64,
                       k: u64,
                       n: u64,
                       w: TensorId,
                       w_scale: TensorId,
                       sizes: u64,
                       ab: TensorId,
                       c: TensorId|
         -> u64 {
            let a_q = doc.raw(GRAPH_POOL, rows * k);
            let a_s = doc.raw(GRAPH_POOL, rows * 4);
            doc.kernel(
                g,
                DYNAMIC_FP8_QUANT,
                [rows as u32, 1, 1],
                [256, 1, 1],
                &[
                    (0, 0, At::Raw(a_q)),
                    (1, 0, At::Raw(a_s)),
                    (2, 0, At::Raw(input)),
                ],
            );
            let a_perm = doc.raw(GRAPH_POOL, rows * k);
            doc.kernel(
                g,
                SHUFFLE_ROWS,
                [rows as u32, 1, 1],
                [256, 1, 1],
                &[
                    (0, 0, At::Raw(a_q)),
                    (1, 0, At::Raw(a_map)),
                    (2, 0, At::Raw(a_perm)),
                ],
            );
            let ptrs = doc.raw(GRAPH_POOL, 5 * EXPERTS * 8);
            let (a_ptrs, b_ptrs, out_ptrs) = (ptrs, ptrs + EXPERTS * 8, ptrs + 2 * EXPERTS * 8);
            let (as_ptrs, bs_ptrs) = (ptrs + 3 * EXPERTS * 8, ptrs + 4 * EXPERTS * 8);
            let out = doc.raw(GRAPH_POOL, rows * n * 2);
            doc.kernel(
                g,
                GROUP_GEMM_STARTS,
                [1, 1, 1],
                [EXPERTS as u32, 1, 1],
                &[
                    (0, 0, At::Raw(offsets)),
                    (1, 0, At::Raw(a_ptrs)),
                    (2, 0, At::Raw(b_ptrs)),
                    (3, 0, At::Raw(out_ptrs)),
                    (4, 0, At::Raw(as_ptrs)),
                    (5, 0, At::Raw(bs_ptrs)),
                    (6, 0, At::Raw(a_perm)),
                    (7, 0, At::T(w)),
                    (8, 0, At::Raw(out)),
                    (9, 0, At::Raw(a_s)),
                    (10, 0, At::T(w_scale)),
                ],
            );
            doc.kernel(
                g,
                CUTLASS_MOE_MM,
                [132, 1, 1],
                [384, 1, 1],
                &[
                    (0, MM_PROBLEMS, At::Raw(sizes)),
                    (0, MM_PTR_A, At::Raw(a_ptrs)),
                    (0, MM_STRIDE_A, At::T(ab)),
                    (0, MM_PTR_B, At::Raw(b_ptrs)),
                    (0, MM_STRIDE_B, At::T(ab)),
                    (0, MM_PTR_C, At::Raw(out_ptrs)),
                    (0, MM_STRIDE_C, At::T(c)),
                    (0, MM_PTR_D, At::Raw(out_ptrs)),
                    (0, MM_STRIDE_D, At::T(c)),
                    (0, MM_ALPHA_A, At::Raw(as_ptrs)),
                    (0, MM_ALPHA_B, At::Raw(bs_ptrs)),
                ],
            );
            out
        };
        let c1_out = grouped(
            doc,
            x.attn_proj,
            HIDDEN,
            2 * MOE_INTERMEDIATE,
            w13,
            w13_scale,
            sizes1,
            ab1,
            c1,
        );
        let act = silu_and_mul(doc, g, rows, c1_out);
        // gemm2's c_strides2 is ab_strides1's tensor: the same address in both GEMMs.
        let c2_out = grouped(
            doc,
            act,
            MOE_INTERMEDIATE,
            HIDDEN,
            w2,
            w2_scale,
            sizes2,
            ab2,
            ab1,
        );
        doc.kernel(
            g,
            MOE_SUM,
            [bs as u32, 1, 1],
            [1024, 1, 1],
            &[(0, 0, At::Raw(x.mlp_out)), (1, 0, At::Raw(c2_out))],
        );
        model.finish(doc, g, x);
    });
    let manifest = doc.manifest();
    let ab1_hex = hex_of(&manifest, &ab1_path);

    // Reload: experts' weights and scales copied back in place; process_weights_after_loading
    // builds a new CutlassExpertsFp8 (new stride tensors, c_strides2 again aliasing
    // ab_strides1) before the old object is dropped.
    reload_parameters_in_place(&mut doc, false);
    let ab1n = fresh(&mut doc, I64, &[EXPERTS]);
    let c1n = fresh(&mut doc, I64, &[EXPERTS]);
    let ab2n = fresh(&mut doc, I64, &[EXPERTS]);
    doc.rebind(&ab1_path, ab1n);
    doc.rebind(&c1_path, c1n);
    doc.rebind(&ab2_path, ab2n);
    if !split {
        doc.rebind(&c2_path, ab1n);
        doc.free(ab1);
    }
    doc.free(c1);
    doc.free(ab2);
    let live = doc.live(&manifest, RELOAD, Contents::Updated);

    let alias = format!("{ab1_path} = {c2_path}");
    if split {
        return Scenario {
            name: "cutlass_moe_alias_split",
            description: "The FP8 CUTLASS MoE layer of cutlass_moe_strides_alias (c_strides2 the                 same tensor as ab_strides1 at capture). The reload builds new stride arrays but                 a partial fix re-derives only ab_strides1, c_strides1 and ab_strides2:                 c_strides2 keeps the captured tensor, which it alone keeps alive, while                 ab_strides1 holds a new one. The graphs read one address for both: a retarget                 cannot tell which of the two the words mean (issue 29: an alias pair split is                 refused)."
                .into(),
            models: "vllm#41670, the alias split by a partial rebuild",
            manifest,
            live: Some(live),
            allow: None,
            explain: vec![c2_path.clone()],
            // ab_strides1 moved (drifted, owners that path alone); c_strides2 kept the captured
            // tensor, so its storage lives and the address is its own: no freed, no reused.
            // c_strides1 and ab_strides2 moved and were freed. All object attributes.
            expect: planned(
                expect(vec![
                    finding(Kind::Drifted, &ab1_path, BOTH),
                    finding(Kind::Drifted, &ab2_path, BOTH),
                    finding(Kind::Drifted, &c1_path, BOTH),
                    finding(Kind::Freed, &ab2_path, BOTH),
                    finding(Kind::Freed, &c1_path, BOTH),
                    finding(Kind::Unregistered, &alias, BOTH),
                    finding(Kind::Unregistered, &ab2_path, BOTH),
                    finding(Kind::Unregistered, &c1_path, BOTH),
                ]),
                // The split alias refuses both graphs (which both read it), whatever their
                // other words.
                &[],
                BOTH,
            ),
        };
    }
    Scenario {
        name: "cutlass_moe_strides_alias",
        description: "An FP8 MoE layer (8 experts, top-2) on vLLM's CUTLASS grouped-GEMM path: \
            the router GEMM and top-k softmax, get_cutlass_moe_mm_data, per-token FP8 quant, \
            __get_group_gemm_starts, and two grouped GEMMs whose by-value Params hold \
            pointers to the per-expert stride arrays ab_strides1/c_strides1 (GEMM 1) and \
            ab_strides2/c_strides2 (GEMM 2). c_strides2 is the same tensor as ab_strides1 \
            (one storage, two owner paths on the CutlassExpertsFp8 object). reload_weights() \
            copies the expert weights back in place but process_weights_after_loading builds a \
            new CutlassExpertsFp8, so all stride arrays move and the old ones are freed: the \
            illegal-address crash of vllm#41670."
            .into(),
        models: "vllm#41670",
        manifest,
        live: Some(live),
        allow: None,
        explain: vec![c2_path.clone(), ab1_hex, "--kernel GemmUniversal".into()],
        // One subject per stride storage; the alias is one subject naming both paths. Each:
        // rebound (drifted), old block free (freed), object attributes only (unregistered).
        expect: planned(
            expect(vec![
                finding(Kind::Drifted, &alias, BOTH),
                finding(Kind::Drifted, &ab2_path, BOTH),
                finding(Kind::Drifted, &c1_path, BOTH),
                finding(Kind::Freed, &alias, BOTH),
                finding(Kind::Freed, &ab2_path, BOTH),
                finding(Kind::Freed, &c1_path, BOTH),
                finding(Kind::Unregistered, &alias, BOTH),
                finding(Kind::Unregistered, &ab2_path, BOTH),
                finding(Kind::Unregistered, &c1_path, BOTH),
            ]),
            BOTH,
            &[],
        ),
    }
}

const MOE_ALIGN: &str = "void vllm::moe::moe_align_block_size_kernel<int>(int const*, int*, int*, int*, int, int, int, int, unsigned long, int*)";
const FUSED_MOE: &str = "fused_moe_kernel";
const EXPAND_ROWS: &str = "void vllm::moe::expandInputRowsKernel<__nv_bfloat16, true>(__nv_bfloat16 const*, __nv_bfloat16*, int const*, int*, long, long const*, int, int)";
const FINALIZE_ROUTING: &str = "void vllm::moe::finalizeMoeRoutingKernel<__nv_bfloat16, __nv_bfloat16, (vllm::moe::ScaleMode)1>(__nv_bfloat16 const*, __nv_bfloat16*, float const*, int const*, int const*, long, long, int)";

/// The router and routing bookkeeping every Triton MoE path launches.
struct Routing {
    topk_weights: u64,
    sorted_ids: u64,
    expert_ids: u64,
    num_post_pad: u64,
    topk_ids: u64,
}

fn route(doc: &mut Doc, g: usize, x: &Acts, gate: TensorId) -> Routing {
    let bs = x.bs;
    let rows = bs * TOPK;
    let logits = doc.raw(GRAPH_POOL, bs * EXPERTS * 2);
    doc.kernel(
        g,
        nvjet(bs),
        [1, 1, 1],
        [384, 1, 1],
        &[
            (0, NVJET_A, At::T(gate)),
            (0, NVJET_B, At::Raw(x.attn_proj)),
            (0, NVJET_C, At::Raw(logits)),
            (0, NVJET_D, At::Raw(logits)),
        ],
    );
    let topk_weights = doc.raw(GRAPH_POOL, rows * 4);
    let topk_ids = doc.raw(GRAPH_POOL, rows * 4);
    doc.kernel(
        g,
        ROUTER_TOPK,
        [bs.div_ceil(4) as u32, 1, 1],
        [32, 4, 1],
        &[
            (0, 0, At::Raw(logits)),
            (2, 0, At::Raw(topk_weights)),
            (4, 0, At::Raw(topk_ids)),
        ],
    );
    let padded = rows + EXPERTS * 15;
    let sorted_ids = doc.raw(GRAPH_POOL, padded * 4);
    let expert_ids = doc.raw(GRAPH_POOL, padded.div_ceil(16) * 4);
    let num_post_pad = doc.raw(GRAPH_POOL, 4);
    doc.kernel(
        g,
        MOE_ALIGN,
        [1, 1, 1],
        [1024, 1, 1],
        &[
            (0, 0, At::Raw(topk_ids)),
            (1, 0, At::Raw(sorted_ids)),
            (2, 0, At::Raw(expert_ids)),
            (3, 0, At::Raw(num_post_pad)),
        ],
    );
    Routing {
        topk_weights,
        sorted_ids,
        expert_ids,
        num_post_pad,
        topk_ids,
    }
}

/// One Triton `fused_moe_kernel` launch; `scales` is `(a_scale, b_scale)` for FP8.
fn fused_moe(
    doc: &mut Doc,
    g: usize,
    r: &Routing,
    a: At,
    b: TensorId,
    c: u64,
    scales: Option<(TensorId, TensorId)>,
) {
    let mut t = vec![(0, 0, a), (1, 0, At::T(b)), (2, 0, At::Raw(c))];
    if let Some((a_scale, b_scale)) = scales {
        t.push((3, 0, At::T(a_scale)));
        t.push((4, 0, At::T(b_scale)));
    }
    t.extend([
        (5, 0, At::Raw(r.topk_weights)),
        (6, 0, At::Raw(r.sorted_ids)),
        (7, 0, At::Raw(r.expert_ids)),
        (8, 0, At::Raw(r.num_post_pad)),
    ]);
    doc.kernel(g, FUSED_MOE, [96, 1, 1], [128, 1, 1], &t);
}

const W13_INPUT_SCALE: &str = "model.layers[0].mlp.experts.w13_input_scale";
const W2_INPUT_SCALE: &str = "model.layers[0].mlp.experts.w2_input_scale";

pub(super) fn owner_removed() -> Scenario {
    let mut doc = Doc::new();
    let model = Model::new(&mut doc, "model", VOCAB);
    let layer = Layer::new(&mut doc, "model.layers[0]", AttnOpts::default());
    let MoeWeights { gate, w13, w2 } = moe_weights(&mut doc, FP8);
    let (w13_scale, w2_scale) = fp8_weight_scales(&mut doc);
    // Static activation scales, reduced to one scalar each at load.
    let w13_in = doc.param(W13_INPUT_SCALE, "FusedMoE", F32, &[]);
    let w2_in = doc.param(W2_INPUT_SCALE, "FusedMoE", F32, &[]);
    capture(&mut doc, |doc, g, x| {
        let rows = x.bs * TOPK;
        model.embed(doc, g, x);
        layer.attention(doc, g, &model.inputs, x);
        let r = route(doc, g, x, gate);
        let quant = |doc: &mut Doc, input: u64, k: u64, scale: TensorId| {
            let q = doc.raw(GRAPH_POOL, rows * k);
            doc.kernel(
                g,
                crate::model::FP8_QUANT_STATIC,
                [rows as u32, 1, 1],
                [256, 1, 1],
                &[
                    (0, 0, At::Raw(q)),
                    (1, 0, At::Raw(input)),
                    (2, 0, At::T(scale)),
                ],
            );
            q
        };
        let a1 = quant(doc, x.attn_proj, HIDDEN, w13_in);
        let c1 = doc.raw(GRAPH_POOL, rows * 2 * MOE_INTERMEDIATE * 2);
        fused_moe(doc, g, &r, At::Raw(a1), w13, c1, Some((w13_in, w13_scale)));
        let act = silu_and_mul(doc, g, rows, c1);
        let a2 = quant(doc, act, MOE_INTERMEDIATE, w2_in);
        let c2 = doc.raw(GRAPH_POOL, rows * HIDDEN * 2);
        fused_moe(doc, g, &r, At::Raw(a2), w2, c2, Some((w2_in, w2_scale)));
        doc.kernel(
            g,
            MOE_SUM,
            [x.bs as u32, 1, 1],
            [1024, 1, 1],
            &[(0, 0, At::Raw(x.mlp_out)), (1, 0, At::Raw(c2))],
        );
        model.finish(doc, g, x);
    });
    let manifest = doc.manifest();
    // The new checkpoint's quantization config says dynamic activation scales, so
    // process_weights_after_loading sets `layer.w13_input_scale = None` (and w2's): the
    // paths resolve to nothing, and the scalars' blocks go back to the free list.
    reload_parameters_in_place(&mut doc, false);
    doc.remove_owner(W13_INPUT_SCALE);
    doc.remove_owner(W2_INPUT_SCALE);
    doc.free(w13_in);
    doc.free(w2_in);
    let live = doc.live(&manifest, RELOAD, Contents::Updated);
    Scenario {
        name: "owner_removed",
        description: "An FP8 MoE layer on the Triton fused_moe_kernel path with static \
            activation scales: the router, top-k softmax and moe_align_block_size, then per \
            expert GEMM a static scaled_fp8_quant reading w13_input_scale / w2_input_scale and \
            fused_moe_kernel reading the weights and both scales; graphs for batch sizes 8 and \
            1. The reloaded checkpoint's config switches to dynamic activation scales, so \
            process_weights_after_loading sets both input-scale parameters to None: their \
            owner paths no longer resolve, the scalars are freed, and the graphs still read \
            them (the `vanished` case of ReloadStorageManifest)."
            .into(),
        models: "vllm#48312, ReloadStorageManifest `vanished`",
        manifest,
        live: Some(live),
        allow: None,
        explain: vec![W13_INPUT_SCALE.into(), "--kernel fused_moe_kernel".into()],
        // Both scales: path gone (vanished), old block free (freed). Parameters at capture,
        // so not unregistered.
        expect: planned(
            expect(vec![
                finding(Kind::Vanished, W13_INPUT_SCALE, BOTH),
                finding(Kind::Vanished, W2_INPUT_SCALE, BOTH),
                finding(Kind::Freed, W13_INPUT_SCALE, BOTH),
                finding(Kind::Freed, W2_INPUT_SCALE, BOTH),
            ]),
            &[],
            BOTH,
        ),
    }
}

const PERMUTE_SCRATCH: &str =
    "model.layers[0].mlp.experts.quant_method.moe_kernel.fused_experts._permute_scratch";

pub(super) fn two_graphs_recapture() -> Scenario {
    let mut doc = Doc::new();
    let model = Model::new(&mut doc, "model", VOCAB);
    let layer = Layer::new(&mut doc, "model.layers[0]", AttnOpts::default());
    let MoeWeights { gate, w13, w2 } = moe_weights(&mut doc, BF16);
    // The experts object's staging buffer for permuted tokens, sized for
    // max_num_batched_tokens (8192) x top-k: 64 MiB, its own segment.
    let scratch = doc.held(
        PERMUTE_SCRATCH,
        "TritonExperts",
        Registration::ObjectAttribute,
        WEIGHTS,
        BF16,
        &[8192 * TOPK, HIDDEN],
    );
    capture(&mut doc, |doc, g, x| {
        let rows = x.bs * TOPK;
        model.embed(doc, g, x);
        layer.attention(doc, g, &model.inputs, x);
        let r = route(doc, g, x, gate);
        let c1 = doc.raw(GRAPH_POOL, rows * 2 * MOE_INTERMEDIATE * 2);
        let c2 = doc.raw(GRAPH_POOL, rows * HIDDEN * 2);
        if x.bs > 1 {
            // Batched path: permute tokens into expert order through the scratch buffer.
            let dest = doc.raw(GRAPH_POOL, rows * 4);
            doc.kernel(
                g,
                EXPAND_ROWS,
                [rows as u32, 1, 1],
                [256, 1, 1],
                &[
                    (0, 0, At::Raw(x.attn_proj)),
                    (1, 0, At::T(scratch)),
                    (2, 0, At::Raw(r.topk_ids)),
                    (3, 0, At::Raw(dest)),
                ],
            );
            fused_moe(doc, g, &r, At::T(scratch), w13, c1, None);
            let act = silu_and_mul(doc, g, rows, c1);
            fused_moe(doc, g, &r, At::Raw(act), w2, c2, None);
            doc.kernel(
                g,
                FINALIZE_ROUTING,
                [x.bs as u32, 1, 1],
                [256, 1, 1],
                &[
                    (0, 0, At::Raw(c2)),
                    (1, 0, At::Raw(x.mlp_out)),
                    (2, 0, At::Raw(r.topk_weights)),
                    (4, 0, At::Raw(dest)),
                ],
            );
        } else {
            // Single-token path: no permutation, the scratch buffer is never read.
            fused_moe(doc, g, &r, At::Raw(x.attn_proj), w13, c1, None);
            let act = silu_and_mul(doc, g, rows, c1);
            fused_moe(doc, g, &r, At::Raw(act), w2, c2, None);
            doc.kernel(
                g,
                MOE_SUM,
                [1, 1, 1],
                [1024, 1, 1],
                &[(0, 0, At::Raw(x.mlp_out)), (1, 0, At::Raw(c2))],
            );
        }
        model.finish(doc, g, x);
    });
    let manifest = doc.manifest();
    // The reload rebuilds the experts object (new scratch, new segment), drops the old one,
    // and reload_weights() ends with torch.cuda.empty_cache(): the old segment is unmapped.
    reload_parameters_in_place(&mut doc, false);
    let scratch2 = fresh(&mut doc, BF16, &[8192 * TOPK, HIDDEN]);
    doc.rebind(PERMUTE_SCRATCH, scratch2);
    doc.free(scratch);
    doc.heap.empty_cache();
    let live = doc.live(&manifest, RELOAD, Contents::Updated);
    Scenario {
        name: "two_graphs_recapture",
        description: "A bf16 MoE layer (8 experts, top-2) on the Triton fused_moe_kernel path, \
            captured at batch sizes 8 and 1. decode_bs8 takes the batched path: \
            expandInputRowsKernel stages the tokens in expert order in the experts object's \
            _permute_scratch (64 MiB, a plain attribute), fused_moe_kernel reads them from \
            there, finalizeMoeRoutingKernel un-permutes; decode_bs1 takes the single-token \
            path and never touches the scratch. The reload rebuilds the experts object with a \
            new scratch, and empty_cache() unmaps the old segment: decode_bs8 now reads \
            unmapped memory (illegal address, vllm#48902) while decode_bs1 is unaffected, so \
            only decode_bs8 must be recaptured."
            .into(),
        models: "vllm#48902",
        manifest,
        live: Some(live),
        allow: None,
        explain: vec![
            PERMUTE_SCRATCH.into(),
            "--kernel expandInputRowsKernel".into(),
        ],
        // Rebound (drifted), old segment unmapped (freed), object attribute (unregistered);
        // only decode_bs8's touches name the scratch.
        expect: planned(
            expect(vec![
                finding(Kind::Drifted, PERMUTE_SCRATCH, BS8),
                finding(Kind::Freed, PERMUTE_SCRATCH, BS8),
                finding(Kind::Unregistered, PERMUTE_SCRATCH, BS8),
            ]),
            BS8,
            &[],
        ),
    }
}
