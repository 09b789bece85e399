//! The decoder every scenario shares: a one-layer slice of a vLLM model (embedding,
//! attention, MLP, norms) with the kernels a decode step launches on an H200, and the
//! graph inputs, KV cache and graph-pool intermediates around them. Scenarios swap in the
//! parts their upstream bug lives in.

use graphcheck::model::format::{Registration, TensorId};

use crate::doc::{At, BF16, DEFAULT, Doc, F32, FP8, GRAPH_POOL, I32, I64, KV_CACHE};

/// Hidden size, heads, head size, KV heads, MLP intermediate size, vocabulary (Qwen3-1.7B).
pub const HIDDEN: u64 = 2048;
pub const HEADS: u64 = 16;
pub const HEAD_DIM: u64 = 128;
pub const KV_HEADS: u64 = 8;
pub const INTERMEDIATE: u64 = 6144;
pub const VOCAB: u64 = 151_936;
pub const MAX_POSITIONS: u64 = 40_960;
/// KV-cache blocks, tokens per block, blocks per sequence in the block table.
pub const KV_BLOCKS: u64 = 2048;
pub const BLOCK_SIZE: u64 = 16;
pub const MAX_BLOCKS_PER_SEQ: u64 = 128;
/// Largest batch the runner captures.
pub const MAX_BATCH: u64 = 8;

/// The graphs every scenario captures, largest first as vLLM does, into one graph pool.
pub const BATCHES: [(&str, u64); 2] = [("decode_bs8", 8), ("decode_bs1", 1)];

pub const EMBED: &str = "void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, int, unsigned int, 2, 2, -2>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<c10::BFloat16 const, unsigned int>, at::cuda::detail::TensorInfo<int const, unsigned int>, int, int, unsigned int, long)";
pub const RMS_NORM: &str = "void vllm::rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, c10::BFloat16 const*, long, c10::BFloat16 const*, float, int, int)";
pub const FUSED_ADD_RMS_NORM: &str = "void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, long, c10::BFloat16*, c10::BFloat16 const*, float, int, int)";
pub const ROTARY: &str = "void vllm::rotary_embedding_kernel<c10::BFloat16, true>(long const*, c10::BFloat16*, c10::BFloat16*, c10::BFloat16 const*, int, long, long, long, int, int, int)";
pub const RESHAPE_AND_CACHE: &str = "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>(__nv_bfloat16 const*, __nv_bfloat16 const*, __nv_bfloat16*, __nv_bfloat16*, long const*, long, long, long, long, long, int, int, int, float const*, float const*)";
pub const RESHAPE_AND_CACHE_FP8: &str = "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, unsigned char, (vllm::Fp8KVCacheDataType)1>(__nv_bfloat16 const*, __nv_bfloat16 const*, unsigned char*, unsigned char*, long const*, long, long, long, long, long, int, int, int, float const*, float const*)";
pub const FLASH_FWD: &str = "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t> >, true, false, false, false, true, true, false, false>(flash::Flash_fwd_params)";
pub const FLASH_FWD_FP8: &str = "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, 128, cutlass::float_e4m3_t, float, cutlass::arch::Sm90, false, false, false, true, true, false, true, false, false, true, false, false>, flash::CollectiveEpilogueFwd<cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cutlass::bfloat16_t, cutlass::arch::Sm90, 256, true, true, false, false>, flash::VarlenDynamicPersistentTileScheduler<128, 256, 128, false, true, true> > > >(flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, 128, cutlass::float_e4m3_t, float, cutlass::arch::Sm90, false, false, false, true, true, false, true, false, false, true, false, false>, flash::CollectiveEpilogueFwd<cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cutlass::bfloat16_t, cutlass::arch::Sm90, 256, true, true, false, false>, flash::VarlenDynamicPersistentTileScheduler<128, 256, 128, false, true, true> >::Params)";
pub const FLASHINFER_DECODE: &str = "void flashinfer::BatchPrefillWithPagedKVCacheKernel<flashinfer::KernelTraits<(flashinfer::MaskMode)0, 16u, 1u, 8u, 8u, 8u, 1u, 4u, (flashinfer::PosEncodingMode)0, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, float, int, flashinfer::DefaultAttention<false, false, false, false> >, flashinfer::BatchPrefillPagedParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int> >(flashinfer::BatchPrefillPagedParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int>)";
pub const FLASHINFER_MERGE: &str = "void flashinfer::PersistentVariableLengthMergeStatesKernel<8u, 16u, 8u, 4u, __nv_bfloat16, __nv_bfloat16, int>(__nv_bfloat16*, float*, int*, __nv_bfloat16*, float*, unsigned int, unsigned int*, unsigned int)";
pub const SILU_AND_MUL: &str = "void vllm::act_and_mul_kernel<c10::BFloat16, &(c10::BFloat16 vllm::silu_kernel<c10::BFloat16>(c10::BFloat16 const&)), false>(c10::BFloat16*, c10::BFloat16 const*, int)";
pub const MUL_SCALAR_TENSOR: &str = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1})";
pub const ADD: &str = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)";
pub const FP8_QUANT_STATIC: &str = "void vllm::scaled_fp8_quant_kernel_strided<c10::BFloat16, c10::Float8_e4m3fn>(c10::Float8_e4m3fn*, c10::BFloat16 const*, float const*, long, long, long, long)";
pub const CUTLASS_FP8_GEMM: &str = "void cutlass::device_kernel<vllm::cutlass_3x_gemm_sm90_fp8<cutlass::float_e4m3_t, cutlass::bfloat16_t, vllm::c3x::ScaledEpilogue, cute::tuple<cute::C<64>, cute::C<128>, cute::C<128> >, cute::tuple<cute::C<1>, cute::C<8>, cute::C<1> >, cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum, cutlass::epilogue::TmaWarpSpecialized>::GemmKernel>(vllm::cutlass_3x_gemm_sm90_fp8<cutlass::float_e4m3_t, cutlass::bfloat16_t, vllm::c3x::ScaledEpilogue, cute::tuple<cute::C<64>, cute::C<128>, cute::C<128> >, cute::tuple<cute::C<1>, cute::C<8>, cute::C<1> >, cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum, cutlass::epilogue::TmaWarpSpecialized>::GemmKernel::Params)";

/// cuBLAS Hopper GEMMs by batch size. They take one packed 1720-byte parameter buffer
/// (`CU_LAUNCH_PARAM_BUFFER_POINTER`), so every pointer is param 0 at a nonzero offset.
pub fn nvjet(bs: u64) -> &'static str {
    if bs >= 8 {
        "nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNT"
    } else {
        "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT"
    }
}
/// Offsets of A (weight), B (activation), C and D (output) in nvjet's packed buffer.
pub const NVJET_A: u32 = 0x148;
pub const NVJET_B: u32 = 0x150;
pub const NVJET_C: u32 = 0x158;
pub const NVJET_D: u32 = 0x160;

/// Offsets in `flash::Flash_fwd_params` (passed by value as param 0).
pub const FA_Q: u32 = 0x0;
pub const FA_K: u32 = 0x8;
pub const FA_V: u32 = 0x10;
pub const FA_O: u32 = 0x60;
pub const FA_SEQUSED_K: u32 = 0x198;
pub const FA_BLOCK_TABLE: u32 = 0x1d0;
pub const FA_K_DESCALE: u32 = 0x270;
pub const FA_V_DESCALE: u32 = 0x278;

/// Offsets in `flashinfer::BatchPrefillPagedParams` (param 0): q, the paged K and V data,
/// the page indices, indptr and last-page lengths, the output, and the split-KV partial
/// outputs `tmp_v` / `tmp_s` that live in the float workspace.
pub const FI_Q: u32 = 0x0;
pub const FI_K: u32 = 0x28;
pub const FI_V: u32 = 0x30;
pub const FI_INDICES: u32 = 0x40;
pub const FI_INDPTR: u32 = 0x48;
pub const FI_LAST_PAGE_LEN: u32 = 0x50;
pub const FI_O: u32 = 0x58;
pub const FI_TMP_V: u32 = 0xb0;
pub const FI_TMP_S: u32 = 0xb8;
/// Where `tmp_s` starts in the float workspace.
pub const FI_TMP_S_OFFSET: u64 = 64 << 20;

/// Offsets of the data pointers in TensorIterator's 648-byte loop closure (param 1).
pub const TI_OUT: u32 = 0x268;
pub const TI_A: u32 = 0x270;
pub const TI_B: u32 = 0x278;

/// Offsets in the CUTLASS 3.x FP8 GEMM `Params` (param 0).
pub const CUTLASS_A: u32 = 0x40;
pub const CUTLASS_B: u32 = 0x50;
pub const CUTLASS_A_SCALE: u32 = 0xb0;
pub const CUTLASS_B_SCALE: u32 = 0xc0;
pub const CUTLASS_D: u32 = 0xe8;

fn grid_rows(bs: u64) -> [u32; 3] {
    [bs as u32, 1, 1]
}

/// The tensors the runner fills before each replay.
#[derive(Clone, Copy, Debug)]
pub struct Inputs {
    pub input_ids: TensorId,
    pub positions: TensorId,
    pub slot_mapping: TensorId,
    pub block_table: TensorId,
    pub seq_lens: TensorId,
}

impl Inputs {
    pub fn new(doc: &mut Doc) -> Inputs {
        Inputs {
            input_ids: doc.input("runner.input_ids", I32, &[MAX_BATCH]),
            positions: doc.input("runner.positions", I64, &[MAX_BATCH]),
            slot_mapping: doc.input("runner.slot_mapping", I64, &[MAX_BATCH]),
            block_table: doc.input("runner.block_table", I32, &[MAX_BATCH, MAX_BLOCKS_PER_SEQ]),
            seq_lens: doc.input("runner.seq_lens", I32, &[MAX_BATCH]),
        }
    }
}

/// A linear layer as its kernels see it.
#[derive(Clone, Copy, Debug)]
pub enum Linear {
    /// bf16 weight `[out, in]`, one cuBLAS GEMM.
    Bf16 { weight: TensorId },
    /// FP8 W8A8 with static per-tensor scales: the weight is stored transposed
    /// (`[in, out]`, stride `[1, in]`) by `process_weights_after_loading`; a quant kernel
    /// reads `input_scale`, the CUTLASS GEMM reads both scales.
    Fp8 {
        weight: TensorId,
        weight_scale: TensorId,
        input_scale: TensorId,
    },
}

impl Linear {
    /// A bf16 linear at `path` (the module's path).
    pub fn bf16(doc: &mut Doc, path: &str, holder: &str, out: u64, inp: u64) -> Linear {
        Linear::Bf16 {
            weight: doc.param(&format!("{path}.weight"), holder, BF16, &[out, inp]),
        }
    }

    /// An FP8 linear at `path`, weight already transposed as Fp8LinearMethod leaves it.
    pub fn fp8(doc: &mut Doc, path: &str, holder: &str, out: u64, inp: u64) -> Linear {
        let weight = doc.param(&format!("{path}.weight"), holder, FP8, &[out, inp]);
        let t = doc.get_mut(weight);
        t.shape = vec![inp, out];
        t.stride = vec![1, inp as i64];
        let weight_scale = doc.param(&format!("{path}.weight_scale"), holder, F32, &[]);
        let input_scale = doc.param(&format!("{path}.input_scale"), holder, F32, &[]);
        Linear::Fp8 {
            weight,
            weight_scale,
            input_scale,
        }
    }

    /// Launches the linear: `input` and `out` are graph-pool addresses.
    pub fn launch(&self, doc: &mut Doc, g: usize, bs: u64, input: u64, out: u64) {
        match *self {
            Linear::Bf16 { weight } => doc.kernel(
                g,
                nvjet(bs),
                [16, bs.div_ceil(8) as u32, 1],
                [384, 1, 1],
                &[
                    (0, NVJET_A, At::T(weight)),
                    (0, NVJET_B, At::Raw(input)),
                    (0, NVJET_C, At::Raw(out)),
                    (0, NVJET_D, At::Raw(out)),
                ],
            ),
            Linear::Fp8 {
                weight,
                weight_scale,
                input_scale,
            } => {
                let x_q = doc.raw(GRAPH_POOL, bs * HIDDEN.max(INTERMEDIATE));
                doc.kernel(
                    g,
                    FP8_QUANT_STATIC,
                    grid_rows(bs),
                    [256, 1, 1],
                    &[
                        (0, 0, At::Raw(x_q)),
                        (1, 0, At::Raw(input)),
                        (2, 0, At::T(input_scale)),
                    ],
                );
                doc.kernel(
                    g,
                    CUTLASS_FP8_GEMM,
                    [132, 1, 1],
                    [384, 1, 1],
                    &[
                        (0, CUTLASS_A, At::Raw(x_q)),
                        (0, CUTLASS_B, At::T(weight)),
                        (0, CUTLASS_A_SCALE, At::T(input_scale)),
                        (0, CUTLASS_B_SCALE, At::T(weight_scale)),
                        (0, CUTLASS_D, At::Raw(out)),
                    ],
                );
            }
        }
    }
}

/// Where the rotary kernel finds its cos/sin cache.
#[derive(Clone, Copy, Debug)]
pub enum Rope {
    /// `rotary_emb.cos_sin_cache`, a non-persistent buffer (vLLM's `RotaryEmbedding`).
    Buffer(TensorId),
    /// A module-level global no owner path reaches.
    Global(u64),
}

/// One decoder layer with grouped-query attention (Qwen3-like).
#[derive(Clone, Debug)]
pub struct Layer {
    pub prefix: String,
    pub input_layernorm: TensorId,
    pub qkv_proj: Linear,
    pub rope: Rope,
    pub kv_cache: TensorId,
    /// FP8 KV-cache scales `(_k_scale, _v_scale)`, where the cache is FP8.
    pub kv_scales: Option<(TensorId, TensorId)>,
    /// The FlashInfer backend's buffers, where it replaces FlashAttention.
    pub flashinfer: Option<FlashInfer>,
    pub o_proj: Linear,
    pub post_attention_layernorm: TensorId,
}

/// How the attention's linears and caches are made.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttnOpts {
    pub fp8_linears: bool,
    pub global_rope: bool,
    pub fp8_kv_cache: bool,
    pub flashinfer: bool,
}

/// The FlashInfer backend's buffers: the 256 MiB float workspace its metadata builder
/// holds as a plain attribute, and the page-table inputs the builder fills per step.
#[derive(Clone, Copy, Debug)]
pub struct FlashInfer {
    pub workspace: TensorId,
    pub indptr: TensorId,
    pub indices: TensorId,
    pub last_page_len: TensorId,
}

/// Where the FlashInfer metadata builder sits in the runner.
pub const FI_BUILDER: &str = "runner.attn_groups[0][0].metadata_builders[0]";

impl Layer {
    /// Makes `{prefix}` = `model.layers[0]`-style layer's attention half and norms.
    pub fn new(doc: &mut Doc, prefix: &str, opts: AttnOpts) -> Layer {
        let input_layernorm = doc.param(
            &format!("{prefix}.input_layernorm.weight"),
            "RMSNorm",
            BF16,
            &[HIDDEN],
        );
        let qkv_out = (HEADS + 2 * KV_HEADS) * HEAD_DIM;
        let qkv_path = format!("{prefix}.self_attn.qkv_proj");
        let o_path = format!("{prefix}.self_attn.o_proj");
        let qkv_proj = if opts.fp8_linears {
            Linear::fp8(doc, &qkv_path, "QKVParallelLinear", qkv_out, HIDDEN)
        } else {
            Linear::bf16(doc, &qkv_path, "QKVParallelLinear", qkv_out, HIDDEN)
        };
        let o_proj = if opts.fp8_linears {
            Linear::fp8(doc, &o_path, "RowParallelLinear", HIDDEN, HEADS * HEAD_DIM)
        } else {
            Linear::bf16(doc, &o_path, "RowParallelLinear", HIDDEN, HEADS * HEAD_DIM)
        };
        let rope = if opts.global_rope {
            // Allocated at import time in the default pool, before anything else.
            Rope::Global(doc.raw(DEFAULT, MAX_POSITIONS * HEAD_DIM * 2))
        } else {
            Rope::Buffer(doc.held(
                &format!("{prefix}.self_attn.rotary_emb.cos_sin_cache"),
                "RotaryEmbedding",
                Registration::BufferNonPersistent,
                crate::doc::WEIGHTS,
                BF16,
                &[MAX_POSITIONS, HEAD_DIM],
            ))
        };
        let post_attention_layernorm = doc.param(
            &format!("{prefix}.post_attention_layernorm.weight"),
            "RMSNorm",
            BF16,
            &[HIDDEN],
        );
        let kv_dtype = if opts.fp8_kv_cache { FP8 } else { BF16 };
        let kv_cache = doc.held(
            &format!("{prefix}.self_attn.attn.kv_cache[0]"),
            "list",
            Registration::RuntimeState,
            KV_CACHE,
            kv_dtype,
            &[2, KV_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM],
        );
        let kv_scales = opts.fp8_kv_cache.then(|| {
            // Made by `initialize_kv_cache` while the kv_cache tag is active (vllm#53343).
            let mut scale = |name: &str| {
                doc.held(
                    &format!("{prefix}.self_attn.attn.{name}"),
                    "Attention",
                    Registration::BufferNonPersistent,
                    KV_CACHE,
                    F32,
                    &[],
                )
            };
            (scale("_k_scale"), scale("_v_scale"))
        });
        let flashinfer = opts.flashinfer.then(|| {
            let workspace = doc.held(
                &format!("{FI_BUILDER}._workspace_buffer"),
                "FlashInferMetadataBuilder",
                Registration::ObjectAttribute,
                DEFAULT,
                crate::doc::U8,
                &[256 << 20],
            );
            let mut input = |name: &str, shape: &[u64]| {
                doc.held(
                    &format!("{FI_BUILDER}.{name}"),
                    "FlashInferMetadataBuilder",
                    Registration::GraphInput,
                    DEFAULT,
                    I32,
                    shape,
                )
            };
            FlashInfer {
                workspace,
                indptr: input("paged_kv_indptr", &[MAX_BATCH + 1]),
                indices: input("paged_kv_indices", &[MAX_BATCH * MAX_BLOCKS_PER_SEQ]),
                last_page_len: input("paged_kv_last_page_len", &[MAX_BATCH]),
            }
        });
        Layer {
            prefix: prefix.into(),
            flashinfer,
            input_layernorm,
            qkv_proj,
            rope,
            kv_cache,
            kv_scales,
            o_proj,
            post_attention_layernorm,
        }
    }

    /// The attention half: norm, QKV, RoPE, cache write, FlashAttention, O projection,
    /// fused residual add and post-attention norm. Reads `x.hidden`, leaves the MLP input
    /// in `x.normed` and the residual in `x.hidden`.
    pub fn attention(&self, doc: &mut Doc, g: usize, inputs: &Inputs, x: &Acts) {
        let bs = x.bs;
        doc.kernel(
            g,
            RMS_NORM,
            grid_rows(bs),
            [256, 1, 1],
            &[
                (0, 0, At::Raw(x.normed)),
                (1, 0, At::Raw(x.hidden)),
                (3, 0, At::T(self.input_layernorm)),
            ],
        );
        self.qkv_proj.launch(doc, g, bs, x.normed, x.qkv);
        let q = x.qkv;
        let k = x.qkv + HEADS * HEAD_DIM * 2;
        let v = k + KV_HEADS * HEAD_DIM * 2;
        let cache = match self.rope {
            Rope::Buffer(t) => At::T(t),
            Rope::Global(a) => At::Raw(a),
        };
        doc.kernel(
            g,
            ROTARY,
            grid_rows(bs),
            [512, 1, 1],
            &[
                (0, 0, At::T(inputs.positions)),
                (1, 0, At::Raw(q)),
                (2, 0, At::Raw(k)),
                (3, 0, cache),
            ],
        );
        let kv = self.kv_cache;
        let half = doc.get(kv).nbytes / 2;
        let mut cache_write = vec![
            (0, 0, At::Raw(k)),
            (1, 0, At::Raw(v)),
            (2, 0, At::T(kv)),
            (3, 0, At::Off(kv, half)),
            (4, 0, At::T(inputs.slot_mapping)),
        ];
        let mut attn = vec![
            (0, FA_Q, At::Raw(q)),
            (0, FA_K, At::T(kv)),
            (0, FA_V, At::Off(kv, half)),
            (0, FA_O, At::Raw(x.attn_out)),
            (0, FA_SEQUSED_K, At::T(inputs.seq_lens)),
            (0, FA_BLOCK_TABLE, At::T(inputs.block_table)),
        ];
        if let Some((ks, vs)) = self.kv_scales {
            cache_write.push((13, 0, At::T(ks)));
            cache_write.push((14, 0, At::T(vs)));
            attn.push((0, FA_K_DESCALE, At::T(ks)));
            attn.push((0, FA_V_DESCALE, At::T(vs)));
        }
        let (cache_kernel, attn_kernel) = if self.kv_scales.is_some() {
            (RESHAPE_AND_CACHE_FP8, FLASH_FWD_FP8)
        } else {
            (RESHAPE_AND_CACHE, FLASH_FWD)
        };
        doc.kernel(g, cache_kernel, grid_rows(bs), [128, 1, 1], &cache_write);
        if let Some(fi) = self.flashinfer {
            let ws = fi.workspace;
            doc.kernel(
                g,
                FLASHINFER_DECODE,
                [132, 1, 1],
                [32, 1, 4],
                &[
                    (0, FI_Q, At::Raw(q)),
                    (0, FI_K, At::T(kv)),
                    (0, FI_V, At::Off(kv, half)),
                    (0, FI_INDICES, At::T(fi.indices)),
                    (0, FI_INDPTR, At::T(fi.indptr)),
                    (0, FI_LAST_PAGE_LEN, At::T(fi.last_page_len)),
                    (0, FI_O, At::Raw(x.attn_out)),
                    (0, FI_TMP_V, At::T(ws)),
                    (0, FI_TMP_S, At::Off(ws, FI_TMP_S_OFFSET)),
                ],
            );
            doc.kernel(
                g,
                FLASHINFER_MERGE,
                [132, 1, 1],
                [16, 8, 1],
                &[
                    (0, 0, At::T(ws)),
                    (1, 0, At::Off(ws, FI_TMP_S_OFFSET)),
                    (2, 0, At::T(fi.indptr)),
                    (3, 0, At::Raw(x.attn_out)),
                ],
            );
        } else {
            doc.kernel(
                g,
                attn_kernel,
                [1, bs as u32, HEADS as u32],
                [128, 1, 1],
                &attn,
            );
        }
        self.o_proj.launch(doc, g, bs, x.attn_out, x.attn_proj);
        doc.kernel(
            g,
            FUSED_ADD_RMS_NORM,
            grid_rows(bs),
            [256, 1, 1],
            &[
                (0, 0, At::Raw(x.attn_proj)),
                (2, 0, At::Raw(x.hidden)),
                (3, 0, At::T(self.post_attention_layernorm)),
            ],
        );
    }
}

/// A bf16 gated MLP: `gate_up_proj`, SiLU-and-mul, `down_proj`.
#[derive(Clone, Copy, Debug)]
pub struct Mlp {
    pub gate_up_proj: Linear,
    pub down_proj: Linear,
}

impl Mlp {
    pub fn new(doc: &mut Doc, prefix: &str, fp8: bool) -> Mlp {
        let make = if fp8 { Linear::fp8 } else { Linear::bf16 };
        Mlp {
            gate_up_proj: make(
                doc,
                &format!("{prefix}.mlp.gate_up_proj"),
                "MergedColumnParallelLinear",
                2 * INTERMEDIATE,
                HIDDEN,
            ),
            down_proj: make(
                doc,
                &format!("{prefix}.mlp.down_proj"),
                "RowParallelLinear",
                HIDDEN,
                INTERMEDIATE,
            ),
        }
    }

    /// Reads `x.attn_proj` (the normed MLP input), writes `x.mlp_out`.
    pub fn launch(&self, doc: &mut Doc, g: usize, x: &Acts) {
        let gate_up = doc.raw(GRAPH_POOL, x.bs * 2 * INTERMEDIATE * 2);
        self.gate_up_proj.launch(doc, g, x.bs, x.attn_proj, gate_up);
        let act = silu_and_mul(doc, g, x.bs, gate_up);
        self.down_proj.launch(doc, g, x.bs, act, x.mlp_out);
    }
}

/// SiLU-and-mul over `[bs, 2 * INTERMEDIATE]` at `input`; returns the output address.
pub fn silu_and_mul(doc: &mut Doc, g: usize, bs: u64, input: u64) -> u64 {
    let out = doc.raw(GRAPH_POOL, bs * INTERMEDIATE * 2);
    doc.kernel(
        g,
        SILU_AND_MUL,
        grid_rows(bs),
        [1024, 1, 1],
        &[(0, 0, At::Raw(out)), (1, 0, At::Raw(input))],
    );
    out
}

/// The graph-pool intermediates of one captured batch size.
#[derive(Clone, Copy, Debug)]
pub struct Acts {
    pub bs: u64,
    /// Embedding output, then the residual stream.
    pub hidden: u64,
    pub normed: u64,
    pub qkv: u64,
    pub attn_out: u64,
    /// O projection output, normed in place into the MLP input.
    pub attn_proj: u64,
    pub mlp_out: u64,
}

impl Acts {
    pub fn new(doc: &mut Doc, bs: u64) -> Acts {
        let row = bs * HIDDEN * 2;
        Acts {
            bs,
            hidden: doc.raw(GRAPH_POOL, row),
            normed: doc.raw(GRAPH_POOL, row),
            qkv: doc.raw(GRAPH_POOL, bs * (HEADS + 2 * KV_HEADS) * HEAD_DIM * 2),
            attn_out: doc.raw(GRAPH_POOL, bs * HEADS * HEAD_DIM * 2),
            attn_proj: doc.raw(GRAPH_POOL, row),
            mlp_out: doc.raw(GRAPH_POOL, row),
        }
    }
}

/// The model around the layer: embedding, final norm, graph inputs.
#[derive(Clone, Debug)]
pub struct Model {
    pub embed_tokens: TensorId,
    pub norm: TensorId,
    pub inputs: Inputs,
}

impl Model {
    /// `{prefix}.embed_tokens.weight` and `{prefix}.norm.weight`, plus the runner's inputs.
    pub fn new(doc: &mut Doc, prefix: &str, vocab: u64) -> Model {
        let inputs = Inputs::new(doc);
        let embed_tokens = doc.param(
            &format!("{prefix}.embed_tokens.weight"),
            "VocabParallelEmbedding",
            BF16,
            &[vocab, HIDDEN],
        );
        let norm = doc.param(&format!("{prefix}.norm.weight"), "RMSNorm", BF16, &[HIDDEN]);
        Model {
            embed_tokens,
            norm,
            inputs,
        }
    }

    /// The embedding lookup into `x.hidden`.
    pub fn embed(&self, doc: &mut Doc, g: usize, x: &Acts) {
        doc.kernel(
            g,
            EMBED,
            [x.bs as u32, 1, 1],
            [128, 4, 1],
            &[
                (0, 0, At::Raw(x.hidden)),
                (1, 0, At::T(self.embed_tokens)),
                (2, 0, At::T(self.inputs.input_ids)),
            ],
        );
    }

    /// The last residual add and the final norm.
    pub fn finish(&self, doc: &mut Doc, g: usize, x: &Acts) {
        doc.kernel(
            g,
            FUSED_ADD_RMS_NORM,
            grid_rows(x.bs),
            [256, 1, 1],
            &[
                (0, 0, At::Raw(x.mlp_out)),
                (2, 0, At::Raw(x.hidden)),
                (3, 0, At::T(self.norm)),
            ],
        );
    }
}
