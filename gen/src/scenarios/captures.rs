//! Capture identity: what happens between two captures. A tensor one graph read dies and
//! a later graph's tensor takes its block; a parameter is rebound between two captures;
//! and the static inputs every graph slices, which must stay clean. Each graph's words
//! name the tensors alive at its own capture (`docs/format.md`, `storage`).

use super::*;
use crate::doc::DEFAULT;

const ATTN: &str = "model.layers[0].self_attn.attn";
/// Entries of a decode plan (int32): the page indices of a full batch, 16 KiB.
const PLAN_LEN: u64 = 4096;
/// The FlashInfer decode kernel, which reads the plan's page indices.
const DECODE: &str = "flashinfer::BatchDecodeWithPagedKVCacheKernel<PosEncodingMode::kNone, 2u, 4u, 8u, 16u, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int>";

/// The dense layer of [`dense`], with `between` run after each batch size is captured
/// (before the next one's state is made) and `during` giving each capture its extra
/// kernels.
fn captured_with(
    opts: AttnOpts,
    mut during: impl FnMut(&mut Doc, usize, &Acts, &mut Model),
    mut between: impl FnMut(&mut Doc, &str, &mut Layer),
) -> Doc {
    let mut doc = Doc::new();
    let model = Model::new(&mut doc, "model", VOCAB);
    let mut layer = Layer::new(&mut doc, "model.layers[0]", opts);
    let mlp = Mlp::new(&mut doc, "model.layers[0]", false);
    for (name, bs) in BATCHES {
        let g = doc.graph(name);
        let x = Acts::new(&mut doc, bs);
        let mut m = model.clone();
        during(&mut doc, g, &x, &mut m);
        m.embed(&mut doc, g, &x);
        layer.attention(&mut doc, g, &m.inputs, &x);
        mlp.launch(&mut doc, g, &x);
        m.finish(&mut doc, g, &x);
        between(&mut doc, name, &mut layer);
    }
    doc
}

fn plan_path(bs: u64) -> String {
    format!("{ATTN}.decode_plan_bs{bs}")
}

pub(super) fn reuse_between_captures() -> Scenario {
    let plans = std::cell::RefCell::new(Vec::new());
    let doc = captured_with(
        AttnOpts::default(),
        |doc, g, x, _| {
            // The plan for this size, made at its first forward, kept as a buffer.
            let plan = doc.held(
                &plan_path(x.bs),
                "Attention",
                Registration::BufferNonPersistent,
                DEFAULT,
                I32,
                &[PLAN_LEN],
            );
            doc.kernel(
                g,
                DECODE,
                [x.bs as u32, 8, 1],
                [32, 4, 1],
                &[(0, 0, At::T(plan)), (0, 16, At::Raw(x.qkv))],
            );
            plans.borrow_mut().push((x.bs, plan));
        },
        |doc, name, _| {
            // The runner releases the capture-time state of a size once its graph is
            // captured, except the last size's: the next capture's plan gets the block.
            if name == "decode_bs8" {
                let (bs, plan) = plans.borrow()[0];
                doc.remove_owner(&plan_path(bs));
                doc.free(plan);
            }
        },
    );
    let (bs8, bs1) = (plans.borrow()[0].1, plans.borrow()[1].1);
    assert_eq!(
        doc.addr(bs1),
        doc.addr(bs8),
        "the allocator hands bs8's freed plan block to bs1's plan"
    );
    let manifest = doc.manifest();
    let at = format!("{:#x}", doc.addr(bs8));
    let live = doc.live(
        &manifest,
        "wake_up() after sleep(level=1)",
        Contents::Preserved,
    );
    let (p8, p1) = (plan_path(8), plan_path(1));
    Scenario {
        name: "reuse_between_captures",
        description: format!(
            "A bf16 decoder layer whose FlashInfer decode kernel reads a decode plan (int32 \
             [{PLAN_LEN}] page indices) that the attention layer builds at the first forward \
             of each batch size and keeps as a non-persistent buffer, {p8} and {p1}. The \
             runner captures batch size 8, then releases that size's capture-time state (its \
             plan buffer is deleted and freed) before capturing batch size 1, whose new plan \
             gets the same 16 KiB block from the caching allocator. decode_bs8 still reads \
             that address: after a level-1 sleep and wake (nothing moved) it reads bs1's \
             plan. The two plans are one view of two storages at one address; the manifest \
             numbers them and each graph names the one it read. Capture-time owners dropped, \
             so a later capture reuses storage an earlier graph still reads (sglang#37168)."
        ),
        models: "sglang#37168, a capture-time owner dropped between two captures",
        manifest,
        live: Some(live),
        allow: None,
        explain: vec![at, p8.clone()],
        // decode_bs8's plan: its path is gone and no owner holds its storage (vanished);
        // its address is active, inside bs1's plan, another owner's tensor (reused).
        // decode_bs1 read what holds the memory now: nothing. Both buffers are registered
        // and in the default pool: nothing at capture time.
        expect: planned(
            expect(vec![
                finding(Kind::Vanished, &p8, BS8),
                finding(Kind::Reused, &p8, BS8),
            ]),
            &[],
            BS8,
        ),
    }
}

const QKV_WEIGHT_SCALE: &str = "model.layers[0].self_attn.qkv_proj.weight_scale";

pub(super) fn rebind_between_captures() -> Scenario {
    let mut old_scale = None;
    let mut doc = captured_with(
        AttnOpts {
            fp8_linears: true,
            ..AttnOpts::default()
        },
        |_, _, _, _| {},
        |doc, name, layer| {
            // A weight sync lands between the two captures: process_weights_after_loading
            // replaces qkv_proj's weight_scale by a new 0-dim Parameter and frees the old.
            if name == "decode_bs8" {
                let old = doc.tensor_at(QKV_WEIGHT_SCALE);
                let new = fresh(doc, F32, &[]);
                doc.rebind(QKV_WEIGHT_SCALE, new);
                doc.free(old);
                let crate::model::Linear::Fp8 { weight_scale, .. } = &mut layer.qkv_proj else {
                    unreachable!("fp8_linears makes FP8 linears")
                };
                *weight_scale = new;
                old_scale = Some(old);
            }
        },
    );
    let manifest = doc.manifest();
    let old = old_scale.expect("rebound after decode_bs8");
    assert_ne!(
        doc.addr(doc.tensor_at(QKV_WEIGHT_SCALE)),
        doc.addr(old),
        "the new scale lies elsewhere"
    );
    let old_hex = format!("{:#x}", doc.addr(old));
    // The trainer's next reload copies every parameter in place, graphs kept.
    reload_parameters_in_place(&mut doc, false);
    let live = doc.live(&manifest, RELOAD, Contents::Updated);
    Scenario {
        name: "rebind_between_captures",
        description: "An FP8 W8A8 decoder layer (static per-tensor scales, CUTLASS FP8 GEMMs \
            whose by-value Params hold both scales) captured at batch size 8, then 1. A weight \
            sync lands between the two captures (an RL rollout engine serving while it \
            captures): process_weights_after_loading replaces qkv_proj's weight_scale by a \
            new 0-dim Parameter at another address and frees the old one. decode_bs8 holds \
            the old address, decode_bs1 the new one: the manifest gives the owner path once \
            per storage it held, each numbered, and each graph names the one it read. After \
            the next in-place reload the parameter still holds the new storage."
            .into(),
        models: "vllm#48312, a parameter rebound between two captures",
        manifest,
        live: Some(live),
        allow: None,
        explain: vec![QKV_WEIGHT_SCALE.into(), old_hex],
        // decode_bs8 read the old scale: its path now holds another tensor (drifted), and
        // the old block is free (freed). decode_bs1 captured what the path holds now.
        expect: planned(
            expect(vec![
                finding(Kind::Drifted, QKV_WEIGHT_SCALE, BS8),
                finding(Kind::Freed, QKV_WEIGHT_SCALE, BS8),
            ]),
            BS8,
            &[],
        ),
    }
}

/// `graphs["{graph}"].inputs["{name}"]`, the owner path of a graph's declared input.
fn input_path(graph: &str, name: &str) -> String {
    format!("graphs[\"{graph}\"].inputs[\"{name}\"]")
}

pub(super) fn sliced_static_input() -> Scenario {
    let mut sliced = Vec::new();
    let mut doc = captured_with(
        AttnOpts::default(),
        |doc, g, x, m| {
            // Each graph reads the first `bs` rows of the runner's static buffers: views of
            // one storage each, declared as the graph's inputs.
            let name = BATCHES[g].0;
            let full = m.inputs;
            let mut slice = |t: TensorId, input: &str| {
                let (shape, stride) = {
                    let b = doc.get(t);
                    let mut shape = b.shape.clone();
                    shape[0] = x.bs;
                    (shape, b.stride.clone())
                };
                // A slice of every row is the buffer's own view: one record.
                let v = if shape == doc.get(t).shape {
                    t
                } else {
                    doc.view(t, 0, &shape, &stride)
                };
                doc.own(
                    &input_path(name, input),
                    v,
                    Registration::GraphInput,
                    "CUDAGraphRunner",
                );
                sliced.push(v);
                v
            };
            m.inputs = crate::model::Inputs {
                input_ids: slice(full.input_ids, "input_ids"),
                positions: slice(full.positions, "positions"),
                slot_mapping: slice(full.slot_mapping, "slot_mapping"),
                block_table: slice(full.block_table, "block_table"),
                seq_lens: slice(full.seq_lens, "seq_lens"),
            };
        },
        |_, _, _| {},
    );
    let mut manifest = doc.manifest();
    // A producer that numbers every storage it saw: the slices of one buffer, one number.
    for &v in &sliced {
        doc.number_all_views(&mut manifest, v);
    }
    reload_parameters_in_place(&mut doc, true);
    let live = doc.live(&manifest, RELOAD, Contents::Updated);
    Scenario {
        name: "sliced_static_input",
        description: "A bf16 decoder layer captured at batch sizes 8 and 1, each graph \
            reading the first rows of the runner's static input buffers (input_ids, \
            positions, slot_mapping, block_table, seq_lens): per graph a view of each \
            buffer's one storage, at one address for both graphs, declared as the graph's \
            inputs. The manifest numbers every storage, so the slices of one buffer carry one \
            number. The layerwise reload copies every parameter in place. Views of one live \
            storage at one address are not another owner's memory: no finding."
            .into(),
        models: "vLLM's static input buffers, sliced per batch size (no hazard)",
        manifest,
        live: Some(live),
        allow: None,
        explain: vec!["runner.input_ids".into()],
        // Every slice's storage is the runner's live buffer, held at its captured address;
        // graph inputs are not persistent, parameters were copied in place with reference
        // digests equal: nothing.
        expect: expect(vec![]),
    }
}
