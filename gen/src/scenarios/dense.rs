//! Scenarios on the dense decoder: the clean reload, static FP8 scales reused by the
//! allocator, an in-place respecification, a module-global cache, KV-pool metadata, and an
//! allowlisted workspace.

use super::*;

pub(super) fn clean_reload_inplace() -> Scenario {
    let (mut doc, _, _, _) = dense(AttnOpts::default());
    let manifest = doc.manifest();
    // Layerwise reload copies every parameter back into its captured storage; the loader
    // also digested a fresh load of the same checkpoint (reference digests, all equal).
    reload_parameters_in_place(&mut doc, true);
    let live = doc.live(&manifest, RELOAD, Contents::Updated);
    Scenario {
        name: "clean_reload_inplace",
        description: "A bf16 Qwen3-style decoder layer (embedding, RMSNorm, QKV/O projections \
            through cuBLAS nvjet GEMMs, RoPE from the rotary embedding's cos_sin_cache buffer, \
            FlashAttention over the KV cache, SiLU MLP) captured at batch sizes 8 and 1 into \
            one graph pool. The RL trainer pushes new weights with reload_weights(): the \
            layerwise reload copies every parameter back into the storage the graphs captured, \
            so addresses and layouts are unchanged and every parameter's digest equals the \
            reference digest of a fresh load. Graph inputs, the KV cache (runtime state) and \
            graph-pool intermediates are present but are not persistent. The copy-back \
            mechanism working as intended (vllm#48312): no finding."
            .into(),
        models: "vllm#48312, the layerwise copy-back working",
        manifest,
        live: Some(live),
        allow: None,
        explain: vec![
            "model.layers[0].mlp.gate_up_proj.weight".into(),
            "--kernel nvjet_sm90".into(),
        ],
        expect: expect(vec![]),
    }
}

const QKV_INPUT_SCALE: &str = "model.layers[0].self_attn.qkv_proj.input_scale";
const O_INPUT_SCALE: &str = "model.layers[0].self_attn.o_proj.input_scale";

pub(super) fn freed_then_reused() -> Scenario {
    let (mut doc, _, _, _) = dense(AttnOpts {
        fp8_linears: true,
        ..AttnOpts::default()
    });
    let manifest = doc.manifest();
    let q_hex = hex_of(&manifest, QKV_INPUT_SCALE);
    // The reload copies every parameter in place, then re-runs
    // process_weights_after_loading, which replaces each static input scale by a new
    // 0-dim Parameter (`replace_parameter(layer, "input_scale", input_scale.max())`):
    // qkv_proj's new scale is allocated, its old block freed; o_proj's new scale then gets
    // exactly that block (best fit), and o_proj's old block is freed.
    reload_parameters_in_place(&mut doc, false);
    let q_old = doc.tensor_at(QKV_INPUT_SCALE);
    let q_new = fresh(&mut doc, F32, &[]);
    doc.rebind(QKV_INPUT_SCALE, q_new);
    doc.free(q_old);
    let o_old = doc.tensor_at(O_INPUT_SCALE);
    let o_new = fresh(&mut doc, F32, &[]);
    doc.rebind(O_INPUT_SCALE, o_new);
    doc.free(o_old);
    assert_eq!(
        doc.addr(o_new),
        doc.addr(q_old),
        "the allocator hands qkv_proj's old block to o_proj"
    );
    let live = doc.live(
        &manifest,
        "reload_weights() with new weights (process_weights_after_loading re-run)",
        Contents::Updated,
    );
    Scenario {
        name: "freed_then_reused",
        description: "An FP8 W8A8 model with static per-tensor activation scales: qkv_proj and \
            o_proj each run scaled_fp8_quant (reading input_scale) and a CUTLASS 3.x FP8 GEMM \
            whose by-value Params hold the quantized input, the transposed FP8 weight and both \
            scales; graphs for batch sizes 8 and 1. The reload copies the parameters in place \
            and re-runs process_weights_after_loading, which replaces each input_scale by a new \
            0-dim Parameter. qkv_proj's old 512-byte block is freed and the caching allocator \
            hands it straight to o_proj's new input_scale: the graphs now quantize qkv_proj's \
            input with o_proj's scale (silent wrong output), and read o_proj's scale from a \
            free block (the reuse case of vllm#48312)."
            .into(),
        models: "vllm#48312, an old address reused by the allocator",
        manifest,
        live: Some(live),
        allow: None,
        explain: vec![QKV_INPUT_SCALE.into(), q_hex],
        // Both scales rebound (drifted). qkv_proj's old address: active, inside o_proj's new
        // input_scale, whose owner is not qkv_proj's (reused). o_proj's old address: free
        // (freed). Parameters, so nothing unregistered.
        expect: planned(
            expect(vec![
                finding(Kind::Drifted, O_INPUT_SCALE, BOTH),
                finding(Kind::Drifted, QKV_INPUT_SCALE, BOTH),
                finding(Kind::Freed, O_INPUT_SCALE, BOTH),
                finding(Kind::Reused, QKV_INPUT_SCALE, BOTH),
            ]),
            BOTH,
            &[],
        ),
    }
}

const DOWN_WEIGHT: &str = "model.layers[0].mlp.down_proj.weight";

pub(super) fn retarget_one_graph_refused() -> Scenario {
    let (mut doc, _, _, _) = dense(AttnOpts {
        fp8_linears: true,
        ..AttnOpts::default()
    });
    let manifest = doc.manifest();
    // The reload of freed_then_reused: both static input scales replaced by new
    // Parameters (qkv_proj's old block handed to o_proj's new scale) ...
    reload_parameters_in_place(&mut doc, false);
    for path in [QKV_INPUT_SCALE, O_INPUT_SCALE] {
        let old = doc.tensor_at(path);
        let new = fresh(&mut doc, F32, &[]);
        doc.rebind(path, new);
        doc.free(old);
    }
    // ... and down_proj's weight respecified in place as its checkpoint layout, a `.view`
    // over the same bytes: same storage and data pointer, another shape.
    let w = doc.tensor_at(DOWN_WEIGHT);
    let t = doc.get_mut(w);
    let (rows, cols) = (t.shape[0], t.shape[1]);
    t.shape = vec![cols, rows];
    t.stride = vec![rows as i64, 1];
    let live = doc.live(&manifest, RELOAD, Contents::Updated);
    Scenario {
        name: "retarget_one_graph_refused",
        description: "The FP8 W8A8 layer of freed_then_reused (static input scales replaced by             new Parameters at the reload, qkv_proj's old block handed to o_proj's new scale),             whose reload also respecifies the bf16 down_proj.weight in place under another             shape. The scales alone could be retargeted (each owner holds one tensor of the             captured layout at a new address); the reshaped weight cannot, and both graphs             read it: a graph is retargeted as a whole or not at all, so both are recaptured,             and the plan lists the edits it would have made (issue 29)."
            .into(),
        models: "vllm#48312, a retargetable and a refused finding in one graph",
        manifest,
        live: Some(live),
        allow: None,
        explain: vec![DOWN_WEIGHT.into()],
        // freed_then_reused's four findings, and reshaped for down_proj.weight.
        expect: planned(
            expect(vec![
                finding(Kind::Drifted, O_INPUT_SCALE, BOTH),
                finding(Kind::Drifted, QKV_INPUT_SCALE, BOTH),
                finding(Kind::Freed, O_INPUT_SCALE, BOTH),
                finding(Kind::Reused, QKV_INPUT_SCALE, BOTH),
                finding(Kind::Reshaped, DOWN_WEIGHT, BOTH),
            ]),
            &[],
            BOTH,
        ),
    }
}

pub(super) fn inplace_reshape() -> Scenario {
    let mut doc = Doc::new();
    let model = Model::new(&mut doc, "model", VOCAB);
    let layer = Layer::new(&mut doc, "model.layers[0]", AttnOpts::default());
    let mlp = Mlp::new(&mut doc, "model.layers[0]", true);
    capture(&mut doc, |doc, g, x| {
        model.embed(doc, g, x);
        layer.attention(doc, g, &model.inputs, x);
        mlp.launch(doc, g, x);
        model.finish(doc, g, x);
    });
    let manifest = doc.manifest();
    // process_weights_after_loading is applied a second time to the already-processed
    // layer: `layer.weight = Parameter(layer.weight.t())` transposes the view back. Same
    // storage, same data pointer, the checkpoint's row-major layout.
    reload_parameters_in_place(&mut doc, false);
    let w = doc.tensor_at(DOWN_WEIGHT);
    let t = doc.get_mut(w);
    t.shape = vec![HIDDEN, crate::model::INTERMEDIATE];
    t.stride = vec![crate::model::INTERMEDIATE as i64, 1];
    let live = doc.live(&manifest, RELOAD, Contents::Updated);
    Scenario {
        name: "inplace_reshape",
        description: "An FP8 W8A8 MLP (gate_up_proj and down_proj through scaled_fp8_quant and \
            CUTLASS FP8 GEMMs) under a bf16 attention block; graphs for batch sizes 8 and 1. \
            Fp8LinearMethod leaves each weight as a transposed view ([in, out], stride \
            [1, in]). The reload copies the new weights in place, then applies \
            process_weights_after_loading to the already-processed down_proj a second time, \
            which transposes the view back: same storage and data pointer, but the live \
            model now reads down_proj.weight as [2048, 6144] row-major while the captured GEMM \
            reads it as [6144, 2048] column-major. The in-place respecification that \
            ReloadStorageManifest calls `respecified`."
            .into(),
        models: "vllm#48312, ReloadStorageManifest `respecified`",
        manifest,
        live: Some(live),
        allow: None,
        explain: vec![
            DOWN_WEIGHT.into(),
            "--kernel cutlass_3x_gemm_sm90_fp8".into(),
        ],
        // Same data pointer and owner, shape and stride differ: reshaped, and nothing else
        // (a parameter, in place, contents updated without reference digests).
        expect: planned(
            expect(vec![finding(Kind::Reshaped, DOWN_WEIGHT, BOTH)]),
            &[],
            BOTH,
        ),
    }
}

pub(super) fn module_global_cache() -> Scenario {
    let (doc, _, layer, _) = dense(AttnOpts {
        global_rope: true,
        ..AttnOpts::default()
    });
    let crate::model::Rope::Global(cache) = layer.rope else {
        unreachable!("global_rope makes a global cache")
    };
    let manifest = doc.manifest();
    // The cache is 10 MiB, so it gets its own segment, right after the default pool's first
    // small segment (the graph inputs): 0x7f34_0000_0000 + 2 MiB.
    const CACHE_SEGMENT: &str = "0x7f3400200000";
    let segment = doc.heap.allocation_at(cache).expect("mapped");
    assert_eq!(
        format!("{:#x}", doc.heap.base_of(segment)),
        CACHE_SEGMENT,
        "the global cache's segment"
    );
    Scenario {
        name: "module_global_cache",
        description: "A bf16 decoder layer whose rotary kernel reads a cos/sin cache kept in a \
            module-level global of the rotary-embedding module (as vllm-ascend's `_cos_cache` \
            / `_sin_cache`), created at import time in the default pool: no parameter, buffer \
            or attribute path reaches it, so the manifest resolves the touch to an allocation \
            and no tensor. Graphs for batch sizes 8 and 1 both read it. Capture only. At sleep \
            level 2 such a global is lost without anyone restoring it (vllm-ascend#17217)."
            .into(),
        models: "vllm-ascend#17217",
        manifest,
        live: None,
        allow: None,
        explain: vec![
            CACHE_SEGMENT.into(),
            "--kernel rotary_embedding_kernel".into(),
        ],
        // The rotary kernel's cache touch names no tensor and lies in a default-pool
        // allocation: unowned, one finding for the allocation (both graphs touch it), subject
        // its base. Graph-pool intermediates are explained by their pool.
        expect: expect(vec![finding(Kind::Unowned, CACHE_SEGMENT, &[])]),
    }
}

pub(super) fn module_global_cache_rebuilt() -> Scenario {
    let (mut doc, _, layer, _) = dense(AttnOpts {
        global_rope: true,
        ..AttnOpts::default()
    });
    let crate::model::Rope::Global(cache) = layer.rope else {
        unreachable!("global_rope makes a global cache")
    };
    let manifest = doc.manifest();
    const CACHE_SEGMENT: &str = "0x7f3400200000";
    assert_eq!(
        format!("{cache:#x}"),
        CACHE_SEGMENT,
        "the cache opens its segment"
    );
    // The reload copies the parameters in place (reference digests equal), then the rotary
    // module rebuilds its global cache: the new tensor is made before the global is
    // rebound, and the old one, no longer referenced, goes back to the allocator. Its
    // segment stays mapped (no empty_cache), so its block is a free block.
    reload_parameters_in_place(&mut doc, true);
    let rebuilt = doc.raw(
        crate::doc::DEFAULT,
        MAX_POSITIONS * crate::model::HEAD_DIM * 2,
    );
    doc.heap.free(cache);
    assert_ne!(
        doc.heap.allocation_at(rebuilt),
        doc.heap.allocation_at(cache),
        "the new cache lies in another segment"
    );
    let live = doc.live(
        &manifest,
        "reload_weights() with new weights (the rotary module's global cache rebuilt)",
        Contents::Updated,
    );
    Scenario {
        name: "module_global_cache_rebuilt",
        description: "The decoder layer of module_global_cache, whose rotary kernel reads a \
            cos/sin cache kept in a module-level global that no owner path reaches. The reload \
            copies every parameter in place (reference digests equal) and then rebuilds the \
            global: the new cache is a new 10 MiB tensor in a new segment, the old one is \
            released and its block is a free block of the caching allocator. Both graphs \
            still read the old block: silent wrong output once it is handed out again (as \
            seen on an H200 with a torch.library custom op reading a module-global tensor, \
            issue 13)."
            .into(),
        models: "vllm-ascend#17217 after a reload, issue 13",
        manifest,
        live: Some(live),
        allow: None,
        explain: vec![CACHE_SEGMENT.into()],
        // The capture-time unowned finding (the allocation base, both graphs), and, its
        // allocation known and the probe at its address free, freed under the same subject.
        // Every parameter is in place with its reference digest: nothing else.
        expect: expect(vec![
            finding(Kind::Freed, CACHE_SEGMENT, BOTH),
            finding(Kind::Unowned, CACHE_SEGMENT, BOTH),
        ]),
    }
}

const K_SCALE: &str = "model.layers[0].self_attn.attn._k_scale";
const V_SCALE: &str = "model.layers[0].self_attn.attn._v_scale";

pub(super) fn kv_pool_metadata() -> Scenario {
    let (mut doc, _, layer, _) = dense(AttnOpts {
        fp8_kv_cache: true,
        ..AttnOpts::default()
    });
    let (ks, vs) = layer.kv_scales.expect("fp8 kv cache has scales");
    let manifest = doc.manifest();
    // Sleep level 1: the weights pool is backed up to the host and restored; the kv_cache
    // pool is discarded and mapped again at the same addresses with fresh pages.
    doc.get_mut(ks).digest = Some(zero_digest());
    doc.get_mut(vs).digest = Some(zero_digest());
    let live = doc.live(&manifest, "sleep(level=1) + wake_up()", Contents::Preserved);
    Scenario {
        name: "kv_pool_metadata",
        description: "A decoder layer with an FP8 KV cache: reshape_and_cache_flash and the \
            FlashAttention-3 kernel read the per-layer _k_scale and _v_scale buffers (the FA3 \
            Params hold them as descale pointers). The buffers are registered, but \
            initialize_kv_cache creates them while the kv_cache memory tag is active, so they \
            live in the pool that sleep discards. The KV cache itself is declared runtime state \
            in the same pool and must not be flagged. The engine sleeps at level 1 and wakes \
            (contents preserved): weights come back from the host copy, the kv_cache pool comes \
            back as fresh pages, and the scales read zero (vllm#53343, persistent metadata \
            allocated under the KV-cache tag)."
            .into(),
        models: "vllm#53343",
        manifest,
        live: Some(live),
        allow: None,
        explain: vec![K_SCALE.into(), "--kernel FlashAttnFwdSm90".into()],
        // The two scale buffers: same address and layout, preserved event, digests differ
        // (stale); persistent and in a `discarded` pool (mispooled). Registered, so not
        // unregistered. The KV cache is runtime state: no finding.
        expect: expect(vec![
            finding(Kind::Stale, K_SCALE, BOTH),
            finding(Kind::Stale, V_SCALE, BOTH),
            finding(Kind::Mispooled, K_SCALE, BOTH),
            finding(Kind::Mispooled, V_SCALE, BOTH),
        ]),
    }
}

const FI_WORKSPACE: &str = "runner.attn_groups[0][0].metadata_builders[0]._workspace_buffer";
const ALLOW_WORKSPACE_GLOB: &str =
    "runner.attn_groups[*][*].metadata_builders[*]._workspace_buffer";
const ALLOW_UNUSED_GLOB: &str = "model.layers[*].self_attn.attn.impl._workspace";

/// The allowlist of `allowlisted_workspace`.
fn allow_toml() -> String {
    format!(
        r#"# Allowlist for the allowlisted_workspace scenario (graphcheck verify --allow).
# Each entry: an owner-path glob (`*` stops only at an attribute's `.`, `**` at nothing, brackets literal),
# the kinds it covers (default: all), and why it is safe.

[[allow]]
path = "{ALLOW_WORKSPACE_GLOB}"
kinds = ["unregistered"]
reason = "FlashInfer float workspace: per-step scratch every forward writes before it reads; vLLM lists it in RUNTIME_STATE_ATTRS"

[[allow]]
path = "{ALLOW_UNUSED_GLOB}"
kinds = ["unregistered"]
reason = "TRT-LLM attention workspace; that backend is no longer used by this deployment"
"#
    )
}

pub(super) fn allowlisted_workspace() -> Scenario {
    let (doc, _, _, _) = dense(AttnOpts {
        flashinfer: true,
        ..AttnOpts::default()
    });
    let manifest = doc.manifest();
    let ws_hex = hex_of(&manifest, FI_WORKSPACE);
    Scenario {
        name: "allowlisted_workspace",
        description: "A bf16 decoder layer on the FlashInfer backend: the batched paged-KV \
            attention kernel and the merge-states kernel keep their split-KV partial results \
            (tmp_v, tmp_s) in the 256 MiB float workspace that FlashInferMetadataBuilder holds \
            as a plain attribute; the page-table buffers the builder fills per step are graph \
            inputs. Graphs for batch sizes 8 and 1, capture only. The workspace is per-step \
            scratch, so the allowlist silences its `unregistered` finding with a reason; a \
            second entry, left over from a backend no longer in use, matches nothing and is \
            itself reported, as a warning that leaves the run clean (vLLM's \
            RUNTIME_STATE_ATTRS / KNOWN_UNREGISTERED lists)."
            .into(),
        models: "vllm#48478, RUNTIME_STATE_ATTRS",
        manifest,
        live: None,
        allow: Some(allow_toml()),
        explain: vec![FI_WORKSPACE.into(), ws_hex],
        // The workspace: object attribute, persistent, none registered → unregistered, which
        // the first entry allows. The second entry allows nothing and `unregistered` was
        // checked → unused_allow, subject its glob: a warning, so exit 0 (exit 1 under
        // `--deny-unused-allow`).
        expect: Expect {
            exit_code: 0,
            findings: vec![finding(Kind::UnusedAllow, ALLOW_UNUSED_GLOB, &[])],
            allowed: vec![finding(Kind::Unregistered, FI_WORKSPACE, BOTH)],
            plan: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowlist_globs_match_what_the_expectations_say() {
        let used = graphcheck::model::owner_path::Glob::new(ALLOW_WORKSPACE_GLOB).unwrap();
        let unused = graphcheck::model::owner_path::Glob::new(ALLOW_UNUSED_GLOB).unwrap();
        let text = allow_toml();
        assert!(text.contains(ALLOW_WORKSPACE_GLOB) && text.contains(ALLOW_UNUSED_GLOB));
        let s = allowlisted_workspace();
        assert!(s.manifest.owners.iter().any(|o| used.is_match(&o.path)));
        assert!(s.manifest.owners.iter().all(|o| !unused.is_match(&o.path)));
    }
}
