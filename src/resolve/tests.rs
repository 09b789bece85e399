//! Tests of resolving: walked words through the signature rules into a manifest.

use super::manifest::*;
use super::signature::*;
use super::walked::*;
use crate::model::format::*;
use crate::testkit::producer;
use std::collections::BTreeMap;

fn spec(base: u64, offset: u64, nbytes: u64, storage: u64) -> TensorSpec {
    TensorSpec {
        storage_base: Addr(base),
        storage_nbytes: storage,
        offset,
        nbytes,
        shape: vec![nbytes / 2],
        stride: vec![1],
        dtype: "bfloat16".into(),
        itemsize: 2,
        device: "cuda:0".into(),
        pool: None,
        digest: None,
        alloc_site: vec![],
        storage: None,
        alive: None,
    }
}

fn word(param: u32, offset: u32, addr: u64, alloc: Option<(u64, u64)>) -> RawWord {
    RawWord {
        param,
        offset,
        addr: Addr(addr),
        allocation: alloc.map(|(b, s)| (Addr(b), s)),
    }
}

#[test]
fn words_resolve_to_views_allocations_and_pools() {
    let mut b = ManifestBuilder::new(producer());
    let weights = b.add_pool("weights", PoolKind::Weights, SleepPolicy::Restored);
    let graph_pool = b.add_pool("graph", PoolKind::Graph, SleepPolicy::Untouched);
    b.add_pool_range(Addr(0x10_0000), 0x20_0000, weights)
        .unwrap();
    b.add_pool_range(Addr(0x40_0000), 0x20_0000, graph_pool)
        .unwrap();
    let w = b.add_tensor(spec(0x10_0000, 0, 0x1000, 0x1000)).unwrap();
    // The second half of w, as a row view, and an alias of w under another path.
    let half = b.add_tensor(spec(0x10_0000, 0x800, 0x800, 0x1000)).unwrap();
    assert_eq!(b.add_tensor(spec(0x10_0000, 0, 0x1000, 0x1000)).unwrap(), w);
    b.add_owner("model.w", w, Registration::Parameter, None)
        .unwrap();
    b.add_owner("model.w_half", half, Registration::ObjectAttribute, None)
        .unwrap();
    b.add_owner("model.w_alias", w, Registration::ModuleAttribute, None)
        .unwrap();
    b.add_owner("model.w", w, Registration::Parameter, None)
        .unwrap();
    assert!(matches!(
        b.add_owner("model.w", half, Registration::Parameter, None),
        Err(BuildError::DuplicateOwner { .. })
    ));
    assert!(
        b.add_owner("model..x", w, Registration::Parameter, None)
            .is_err()
    );
    let seg_w = Some((0x10_0000, 0x20_0000));
    let seg_g = Some((0x40_0000, 0x20_0000));
    let walked = WalkedGraph {
        node_counts: BTreeMap::from([("kernel".into(), 1)]),
        unread: vec![],
        nodes: vec![WalkedNode {
            index: 0,
            kind: NodeKind::Kernel,
            name: "k".into(),
            grid: Some([1, 1, 1]),
            block: Some([32, 1, 1]),
            parent: None,
            opaque: None,
            words: vec![
                word(0, 0, 0x10_0000, seg_w), // start of w: w, not its half
                word(0, 8, 0x10_0900, seg_w), // inside the half: the narrower owned view
                word(1, 0, 0x40_0100, seg_g), // a graph-pool intermediate
            ],
        }],
        graph_allocations: vec![],
    };
    b.add_graph("bs1", Some(graph_pool), walked);
    let m = b.finish().unwrap();
    let t = &m.graphs[0].nodes[0].touches;
    assert_eq!(t[0].tensor, Some(w));
    assert_eq!(t[1].tensor, Some(half));
    assert_eq!(t[2].tensor, None);
    assert_eq!(m.allocations.len(), 2);
    assert_eq!(m.allocations[1].pool, Some(graph_pool));
    assert_eq!(m.tensors[0].pool, Some(weights));
    assert_eq!(m.tensors[0].allocation, Some(m.allocations[0].id));
    // The result verifies: the plain-attribute alias keeps w registered, nothing unowned.
    let r =
        crate::check::verify::verify(&m, None, &crate::check::allow::Allowlist::default()).unwrap();
    assert!(
        r.findings
            .iter()
            .all(|f| f.kind != crate::check::finding::FindingKind::Unowned),
        "{:?}",
        r.findings
    );
}

fn one_node(name: &str, words: Vec<RawWord>) -> WalkedGraph {
    WalkedGraph {
        node_counts: BTreeMap::from([("kernel".into(), 1)]),
        unread: vec![],
        nodes: vec![WalkedNode {
            index: 0,
            kind: NodeKind::Kernel,
            name: name.into(),
            grid: None,
            block: None,
            parent: None,
            opaque: None,
            words,
        }],
        graph_allocations: vec![],
    }
}

#[test]
fn memory_of_graph_allocation_nodes_belongs_to_the_graph() {
    // A captured cudaMallocAsync: the mem_alloc node's memory, read by a kernel of the
    // same graph, is the graph's own (a graph pool), not an unowned address.
    let mut b = ManifestBuilder::new(producer());
    let range = Some((0x7000_0000, 0x1000));
    let mut walked = one_node("k", vec![word(0, 0, 0x7000_0040, range)]);
    walked.nodes.insert(
        0,
        WalkedNode {
            index: 1,
            kind: NodeKind::MemAlloc,
            name: "mem_alloc (4096 bytes)".into(),
            grid: None,
            block: None,
            parent: None,
            opaque: None,
            words: vec![word(0, 0, 0x7000_0000, range)],
        },
    );
    walked.graph_allocations = vec![(Addr(0x7000_0000), 0x1000)];
    b.add_graph("g", None, walked);
    let m = b.finish().unwrap();
    assert_eq!(m.pools.len(), 1);
    assert_eq!(m.pools[0].kind, PoolKind::Graph);
    assert_eq!(m.pools[0].name, "g graph allocations");
    assert_eq!(m.allocations[0].pool, Some(m.pools[0].id));
    let r =
        crate::check::verify::verify(&m, None, &crate::check::allow::Allowlist::default()).unwrap();
    assert!(r.findings.is_empty(), "{:?}", r.findings);

    // Without the declaration the same word is unowned: the test can fail.
    let mut b = ManifestBuilder::new(producer());
    b.add_graph(
        "g",
        None,
        one_node("k", vec![word(0, 0, 0x7000_0040, range)]),
    );
    let m = b.finish().unwrap();
    let r =
        crate::check::verify::verify(&m, None, &crate::check::allow::Allowlist::default()).unwrap();
    assert!(
        r.findings
            .iter()
            .any(|f| f.kind == crate::check::finding::FindingKind::Unowned),
        "{:?}",
        r.findings
    );
}

/// Guards the Qwen3 false `unowned` (fixtures/gpu/corpus_qwen3_*): stale bytes in the
/// unused `strides` slots of a by-value TensorInfo are not touches.
#[test]
fn tensor_info_index_slots_are_ignored_by_the_kernel_signature() {
    let mut b = ManifestBuilder::new(producer());
    let idx = b.add_tensor(spec(0x10_0000, 0, 0x100, 0x100)).unwrap();
    b.add_owner("model.idx", idx, Registration::Buffer, None)
        .unwrap();
    let name = "void at::native::(anonymous namespace)::indexSelectSmallIndex<float, long, unsigned int, 2, 2, -2>(at::cuda::detail::TensorInfo<float, unsigned int>, at::cuda::detail::TensorInfo<float const, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, long)";
    let seg = Some((0x10_0000, 0x20_0000));
    let stale = Some((0x80_0000, 0x20_0000));
    b.add_graph(
        "g",
        None,
        one_node(
            name,
            vec![
                word(2, 0, 0x10_0000, seg),     // data: the index tensor
                word(2, 176, 0x80_0000, stale), // strides[17]: stale bytes
                word(2, 192, 0x80_0000, stale),
            ],
        ),
    );
    let m = b.finish().unwrap();
    let n = &m.graphs[0].nodes[0];
    assert_eq!(n.touches.len(), 1);
    assert_eq!(n.touches[0].tensor, Some(idx));
    assert_eq!(
        n.ignored
            .iter()
            .map(|w| (w.offset, w.reason))
            .collect::<Vec<_>>(),
        [
            (176, IgnoredReason::IndexSlot),
            (192, IgnoredReason::IndexSlot)
        ]
    );
    let r =
        crate::check::verify::verify(&m, None, &crate::check::allow::Allowlist::default()).unwrap();
    assert!(r.findings.is_empty(), "{:?}", r.findings);
}

/// Guards the false `unowned` of torch's elementwise kernels (OffsetCalculator sets only
/// `dims` of its slots): a struct word into free memory that names no tensor is ignored;
/// one into live memory, into a graph pool, or at offset 0 is still a touch.
#[test]
fn struct_words_into_free_memory_are_ignored() {
    let mut b = ManifestBuilder::new(producer());
    let graph_pool = b.add_pool("graph", PoolKind::Graph, SleepPolicy::Untouched);
    b.add_pool_range(Addr(0x40_0000), 0x20_0000, graph_pool)
        .unwrap();
    let x = b.add_tensor(spec(0x10_0000, 0, 0x100, 0x100)).unwrap();
    b.add_owner("model.x", x, Registration::Buffer, None)
        .unwrap();
    b.add_free_range(Addr(0x80_0000), 0x10_0000); // a free block of a default segment
    b.add_free_range(Addr(0x10_0000), 0x20_0000); // stale range over x: x still wins
    b.add_free_range(Addr(0x40_0000), 0x1000); // free in the graph pool
    let lambda = "void at::native::elementwise_kernel<128, 2, F>(int, F)";
    let (seg, free_seg, gp) = (
        Some((0x10_0000, 0x20_0000)),
        Some((0x80_0000, 0x20_0000)),
        Some((0x40_0000, 0x20_0000)),
    );
    b.add_graph(
        "g",
        Some(graph_pool),
        one_node(
            lambda,
            vec![
                word(1, 40, 0x81_0000, free_seg), // stale: ignored
                word(1, 48, 0x90_0000, free_seg), // past the free block: a live block
                word(1, 0, 0x80_0100, free_seg),  // offset 0: kept
                word(1, 608, 0x10_0000, seg),     // x
                word(1, 616, 0x40_0000, gp),      // graph-pool intermediate
            ],
        ),
    );
    let m = b.finish().unwrap();
    let n = &m.graphs[0].nodes[0];
    let kept: Vec<u32> = n.touches.iter().map(|t| t.offset).collect();
    assert_eq!(kept, [48, 0, 608, 616]);
    assert_eq!(n.ignored.len(), 1);
    assert_eq!(
        (n.ignored[0].offset, n.ignored[0].reason),
        (40, IgnoredReason::FreeMemory)
    );
    assert_eq!(n.touches[2].tensor, Some(x));
}

/// Guards the false `unowned` of torch's elementwise kernels on Qwen3's decode step
/// (fixtures/gpu/corpus_qwen3_decode_*): stale bytes in the unset slots of the
/// closure's `OffsetCalculator<3>` (param 1, offset 560) pointed at a live segment.
#[test]
fn elementwise_closure_index_slots_are_found_from_the_operand_array() {
    let closure = "void at::native::gpu_kernel_impl_nocast<at::native::(anonymous namespace)::CompareFunctor<long> >(at::TensorIteratorBase&, at::native::(anonymous namespace)::CompareFunctor<long> const&)::{lambda(int)#1}";
    let name = format!("void at::native::elementwise_kernel<128, 4, {closure}>(int, {closure})");
    assert_eq!(offset_calculator_size(3), 608);
    assert_eq!(closure_data_offset(&[560, 608, 616, 624]), Some(608));
    assert_eq!(closure_data_offset(&[504, 512]), Some(504)); // N = 2
    assert_eq!(closure_data_offset(&[560, 600]), None); // no layout fits: keep all
    let mut b = ManifestBuilder::new(producer());
    let x = b.add_tensor(spec(0x10_0000, 0, 0x100, 0x100)).unwrap();
    b.add_owner("model.x", x, Registration::Buffer, None)
        .unwrap();
    let live = Some((0x80_0000, 0x20_0000)); // a live segment: the free rule cannot help
    let seg = Some((0x10_0000, 0x20_0000));
    let words = vec![
        word(1, 560, 0x80_0000, live),
        word(1, 608, 0x10_0000, seg),
        word(1, 616, 0x10_0000, seg),
        word(1, 624, 0x10_0000, seg),
    ];
    b.add_graph("g", None, one_node(&name, words));
    let unrolled = "void at::native::unrolled_elementwise_kernel<F, std::array<char*, 2ul>, OffsetCalculator<1, unsigned int, false>, OffsetCalculator<1, unsigned int, false>, L, S>(int, F, std::array<char*, 2ul>, OffsetCalculator<1, unsigned int, false>, OffsetCalculator<1, unsigned int, false>, L, S)";
    b.add_graph(
        "h",
        None,
        one_node(
            unrolled,
            vec![word(2, 0, 0x10_0000, seg), word(3, 16, 0x80_0000, live)],
        ),
    );
    let m = b.finish().unwrap();
    let n = &m.graphs[0].nodes[0];
    assert_eq!(
        n.touches.iter().map(|t| t.offset).collect::<Vec<_>>(),
        [608, 616, 624]
    );
    assert_eq!(
        (n.ignored[0].offset, n.ignored[0].reason),
        (560, IgnoredReason::IndexSlot)
    );
    let h = &m.graphs[1].nodes[0];
    assert_eq!((h.touches.len(), h.ignored.len()), (1, 1));
    assert_eq!(h.ignored[0].param, 3);
    assert_eq!(param_layouts(unrolled)[2], ParamLayout::PointerArray);
    let r =
        crate::check::verify::verify(&m, None, &crate::check::allow::Allowlist::default()).unwrap();
    assert!(r.findings.is_empty(), "{:?}", r.findings);
}

/// A pointer freed between capture and build, in a parameter the signature types as
/// an array of pointers, is a touch (the dangling read is reported), and a name
/// parsed into too few parameters makes every word a candidate again.
#[test]
fn operand_pointers_into_free_memory_stay_touches() {
    let mut b = ManifestBuilder::new(producer());
    b.add_free_range(Addr(0x80_0000), 0x10_0000);
    let free_seg = Some((0x80_0000, 0x20_0000));
    let vectorized = "void at::native::vectorized_elementwise_kernel<4, F, std::array<char*, 2ul> >(int, F, std::array<char*, 2ul>)";
    b.add_graph(
        "g",
        None,
        one_node(vectorized, vec![word(2, 8, 0x80_0100, free_seg)]),
    );
    // `(int)` alone, but words at param 1: the parse cannot be right.
    b.add_graph(
        "h",
        None,
        one_node(
            "k<at::cuda::detail::TensorInfo<float, unsigned int> >(int)",
            vec![word(1, 16, 0x80_0200, free_seg)],
        ),
    );
    let m = b.finish().unwrap();
    assert_eq!(m.graphs[0].nodes[0].touches.len(), 1);
    assert!(m.graphs[0].nodes[0].ignored.is_empty());
    let h = &m.graphs[1].nodes[0];
    let reasons: Vec<_> = h.ignored.iter().map(|w| w.reason).collect();
    assert_eq!(reasons, [IgnoredReason::FreeMemory]);
    let r =
        crate::check::verify::verify(&m, None, &crate::check::allow::Allowlist::default()).unwrap();
    assert_eq!(r.findings.len(), 1, "{:?}", r.findings);
    assert_eq!(
        r.findings[0].kind,
        crate::check::finding::FindingKind::Unowned
    );
}
/// torch's RNG kernels as `cuFuncGetName` names them (mangled by g++ from declarations
/// shaped like torch's: `fused_dropout_kernel_vec`, and the grid-stride kernel that
/// `torch.randn` launches through `normal_and_transform`).
const DROPOUT_MANGLED: &str = "_ZN2at6native12_GLOBAL__N_124fused_dropout_kernel_vecIffjLi1ELi4EbEEvNS_4cuda6detail10TensorInfoIKT_T1_EENS5_IS6_S8_EENS5_IT4_S8_EES8_T0_NS_15PhiloxCudaStateE";
const RANDN_MANGLED: &str = "_ZN2at6native12_GLOBAL__N_143distribution_elementwise_grid_stride_kernelIfLi4EZNS0_9templates4cuda20normal_and_transformIffLm4EPNS_17CUDAGeneratorImplEZNS0_13normal_kernelERNS_18TensorIteratorBaseES7_EUlfE_EEvS9_T2_T3_EUlP24curandStatePhilox4_32_10E_ZNS4_27distribution_nullary_kernelIffLi4ES7_SF_SA_EEvS9_SB_RKSC_T4_EUlifE_EEvlNS_15PhiloxCudaStateET1_SB_";

#[test]
fn philox_state_parameters_are_found_in_demangled_signatures() {
    let dropout = crate::resolve::demangle::demangle(DROPOUT_MANGLED);
    assert!(
        dropout.ends_with(", unsigned int, float, at::PhiloxCudaState)"),
        "{dropout}"
    );
    let layouts = param_layouts(&dropout);
    assert_eq!(layouts.len(), 6);
    assert_eq!(layouts[0], ParamLayout::TensorInfo);
    assert_eq!(layouts[5], ParamLayout::PhiloxState);
    let randn = crate::resolve::demangle::demangle(RANDN_MANGLED);
    let layouts = param_layouts(&randn);
    assert_eq!(layouts.len(), 4, "{randn}");
    assert_eq!(layouts[1], ParamLayout::PhiloxState);
    // The shape a demangler that keeps template parameters unexpanded gives.
    let short = "void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<float, 4, at::native::templates::cuda::normal_and_transform<float, float, at::CUDAGeneratorImpl*, F>(at::TensorIteratorBase&, at::CUDAGeneratorImpl*, F)::{lambda(curandStatePhilox4_32_10*)#1}, G>(long, at::PhiloxCudaState, T3, T4)";
    assert_eq!(param_layouts(short)[1], ParamLayout::PhiloxState);
    for t in [
        "at::PhiloxCudaState",
        "PhiloxCudaState",
        "::at::PhiloxCudaState",
        "at::PhiloxCudaState const",
    ] {
        assert!(is_philox_state(t), "{t}");
    }
    for t in [
        "at::PhiloxCudaState*",
        "at::PhiloxCudaState const&",
        "at::PhiloxXpuState",
        "my::PhiloxCudaStateLike",
    ] {
        assert!(!is_philox_state(t), "{t}");
    }
}

/// Guards the false `unowned` of every RNG kernel in a graph (`torch.randn`, dropout,
/// `bernoulli_`): the philox `seed_`/`offset_` words point at the CUDA generator's
/// graph-safe state, which torch owns and no Python object reaches.
#[test]
fn philox_seed_and_offset_words_are_rng_state() {
    let rng_seg = Some((0x90_0000, 0x20_0000)); // torch's generator state tensors
    let seg = Some((0x10_0000, 0x20_0000));
    let build = |name: &str| {
        let mut b = ManifestBuilder::new(producer());
        let x = b.add_tensor(spec(0x10_0000, 0, 0x100, 0x100)).unwrap();
        let y = b.add_tensor(spec(0x10_1000, 0, 0x100, 0x100)).unwrap();
        b.add_owner("model.x", x, Registration::Buffer, None)
            .unwrap();
        b.add_owner("model.y", y, Registration::Buffer, None)
            .unwrap();
        let words = vec![
            word(0, 0, 0x10_0000, seg),     // TensorInfo data: x
            word(1, 0, 0x10_1000, seg),     // TensorInfo data: y
            word(5, 0, 0x90_0000, rng_seg), // seed_.ptr
            word(5, 8, 0x90_0200, rng_seg), // offset_.ptr
        ];
        b.add_graph("g", None, one_node(name, words));
        b.finish().unwrap()
    };
    let m = build(&crate::resolve::demangle::demangle(DROPOUT_MANGLED));
    let n = &m.graphs[0].nodes[0];
    assert_eq!(
        n.touches.iter().map(|t| t.tensor).collect::<Vec<_>>(),
        [Some(TensorId(0)), Some(TensorId(1))]
    );
    assert_eq!(
        n.ignored
            .iter()
            .map(|w| (w.param, w.offset, w.addr, w.reason))
            .collect::<Vec<_>>(),
        [
            (5, 0, Addr(0x90_0000), IgnoredReason::RngState),
            (5, 8, Addr(0x90_0200), IgnoredReason::RngState)
        ]
    );
    let r =
        crate::check::verify::verify(&m, None, &crate::check::allow::Allowlist::default()).unwrap();
    assert!(r.findings.is_empty(), "{:?}", r.findings);
    let text = crate::present::normalize::normalized_manifest(&m);
    assert!(
        text.contains("param 5 +8: ignored (torch's RNG state)"),
        "{text}"
    );

    // A kernel whose name gives no signature: the same words are unowned (one finding:
    // grouped by the allocation they lie in).
    let m = build("fused_dropout_kernel_vec");
    let r =
        crate::check::verify::verify(&m, None, &crate::check::allow::Allowlist::default()).unwrap();
    assert_eq!(
        r.findings.iter().map(|f| f.kind).collect::<Vec<_>>(),
        [crate::check::finding::FindingKind::Unowned]
    );
}

#[test]
fn an_empty_graph_builds_and_verifies_clean() {
    // torch only warns on an empty capture: the graph is recorded with no node.
    let mut b = ManifestBuilder::new(producer());
    b.add_graph("empty", None, WalkedGraph::default());
    let m = b.finish().unwrap();
    assert_eq!(m.graphs.len(), 1);
    assert!(m.graphs[0].nodes.is_empty());
    let r =
        crate::check::verify::verify(&m, None, &crate::check::allow::Allowlist::default()).unwrap();
    assert!(r.ok && r.findings.is_empty(), "{:?}", r.findings);
    assert!(
        WalkedGraph::default()
            .unexplained(&RangeSet::default())
            .is_empty()
    );
}

#[test]
fn range_sets_merge_and_answer_membership() {
    let r = RangeSet::from_sizes([(0x300, 0x10), (0x100, 0x100), (0x180, 0x100), (0x500, 0)]);
    assert_eq!(r.len(), 2); // [0x100, 0x280) and [0x300, 0x310); the empty one dropped
    for (addr, inside) in [
        (0xff, false),
        (0x100, true),
        (0x27f, true),
        (0x280, false),
        (0x30f, true),
        (0x310, false),
        (0x500, false),
    ] {
        assert_eq!(r.contains(addr), inside, "{addr:#x}");
    }
    // Adjacent ranges merge; an end past u64::MAX saturates.
    assert_eq!(RangeSet::new([(0, 4), (4, 8)]).len(), 1);
    assert!(RangeSet::from_sizes([(u64::MAX - 1, 16)]).contains(u64::MAX - 1));
    assert!(RangeSet::default().is_empty());
}

/// What the recorder asks before walking its roots again: the words no known range
/// explains, without those the signature sets aside.
#[test]
fn unexplained_words_leave_out_known_ranges_and_set_aside_words() {
    let seg = Some((0x10_0000, 0x20_0000));
    let dropout = crate::resolve::demangle::demangle(DROPOUT_MANGLED);
    let mut g = one_node(
        &dropout,
        vec![
            word(0, 0, 0x10_0000, seg),   // known
            word(1, 0, 0x50_0000, None),  // new: data of a TensorInfo
            word(1, 16, 0x60_0000, None), // index slot
            word(5, 0, 0x90_0000, None),  // RNG state
            word(5, 8, 0x90_0200, None),
        ],
    );
    g.nodes.push(WalkedNode {
        index: 1,
        ..one_node(
            "k",
            vec![word(0, 0, 0x50_0000, None), word(0, 8, 0x10_0040, seg)],
        )
        .nodes[0]
            .clone()
    });
    let known = RangeSet::from_sizes([(0x10_0000, 0x100)]);
    assert_eq!(g.unexplained(&known), [Addr(0x50_0000)]);
    let known = RangeSet::from_sizes([(0x10_0000, 0x100), (0x50_0000, 8)]);
    assert!(g.unexplained(&known).is_empty());
    // Memory the graph allocates itself explains its words.
    let mut own = g.clone();
    own.graph_allocations = vec![(Addr(0x50_0000), 0x100)];
    assert!(
        own.unexplained(&RangeSet::from_sizes([(0x10_0000, 0x100)]))
            .is_empty()
    );
    // Nothing known: every word that is not set aside, once each, ascending.
    assert_eq!(
        g.unexplained(&RangeSet::default()),
        [Addr(0x10_0000), Addr(0x10_0040), Addr(0x50_0000)]
    );
}

/// Guards the false `unowned` of every NCCL collective in a tensor-parallel graph (two
/// H200s, TP=2): the `comm` word at offset 0 of `ncclDevKernelArgsStorage` points at the
/// communicator's device state, memory NCCL maps itself; the user buffers later in the same
/// parameter stay touches.
#[test]
fn the_nccl_communicator_word_is_set_aside_and_the_user_buffers_stay_touches() {
    let name =
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)";
    assert_eq!(param_layouts(name), [ParamLayout::NcclArgs]);
    let nccl_seg = Some((0x7000_0000, 0x20_0000)); // NCCL's own mapping, no pool
    let seg = Some((0x10_0000, 0x20_0000));
    let mut b = ManifestBuilder::new(producer());
    let x = b.add_tensor(spec(0x10_0000, 0, 0x100, 0x100)).unwrap();
    b.add_owner("model.y", x, Registration::Buffer, None)
        .unwrap();
    let words = vec![
        word(0, 0, 0x7000_0000, nccl_seg), // ncclDevKernelArgs::comm
        word(0, 72, 0x10_0000, seg),       // sendbuff
        word(0, 80, 0x10_0000, seg),       // recvbuff
    ];
    b.add_graph("g", None, one_node(name, words));
    let m = b.finish().unwrap();
    let n = &m.graphs[0].nodes[0];
    assert_eq!(
        n.touches
            .iter()
            .map(|t| (t.offset, t.tensor))
            .collect::<Vec<_>>(),
        [(72, Some(TensorId(0))), (80, Some(TensorId(0)))]
    );
    assert_eq!(
        n.ignored
            .iter()
            .map(|w| (w.param, w.offset, w.reason))
            .collect::<Vec<_>>(),
        [(0, 0, IgnoredReason::NcclComm)]
    );
    let r =
        crate::check::verify::verify(&m, None, &crate::check::allow::Allowlist::default()).unwrap();
    assert!(r.findings.is_empty(), "{:?}", r.findings);
    let text = crate::present::normalize::normalized_manifest(&m);
    assert!(
        text.contains("param 0 +0: ignored (NCCL's communicator)"),
        "{text}"
    );
}

#[test]
fn each_graph_resolves_to_the_storage_alive_at_its_capture() {
    // model.a is read by bs1 and dies; model.b, another storage with its layout, takes
    // its memory and is read by bs2: two records, and each graph's word names its own.
    let mut b = ManifestBuilder::new(producer());
    let seg = Some((0x10_0000, 0x20_0000));
    let mut a = spec(0x10_0000, 0, 0x1000, 0x1000);
    (a.storage, a.alive) = (Some(0), Some((0, Some(1))));
    let mut later = spec(0x10_0000, 0, 0x1000, 0x1000);
    (later.storage, later.alive) = (Some(1), Some((1, None)));
    let ta = b.add_tensor(a.clone()).unwrap();
    let tb = b.add_tensor(later).unwrap();
    assert_ne!(ta, tb);
    assert_eq!(
        b.add_tensor(a).unwrap(),
        ta,
        "one storage's view is one record"
    );
    b.add_owner("model.a", ta, Registration::Buffer, None)
        .unwrap();
    b.add_owner("model.b", tb, Registration::Buffer, None)
        .unwrap();
    for name in ["bs1", "bs2"] {
        b.add_graph(name, None, one_node("k", vec![word(0, 0, 0x10_0000, seg)]));
    }
    let m = b.finish().unwrap();
    let read: Vec<Option<TensorId>> = m
        .graphs
        .iter()
        .map(|g| g.nodes[0].touches[0].tensor)
        .collect();
    assert_eq!(read, [Some(ta), Some(tb)]);
    assert_eq!(
        (m.tensors[0].storage, m.tensors[1].storage),
        (Some(0), Some(1))
    );
    // The numbers survive both formats' round trip.
    for v in [1, 2] {
        let text = serde_json::to_vec(&m.clone().in_version(v)).unwrap();
        let back =
            crate::codec::load::parse_manifest(&text, std::path::Path::new("m.json")).unwrap();
        assert_eq!(back.tensors, m.tensors, "format {v}");
    }
}

#[test]
fn a_path_rebound_between_captures_names_each_storage_a_graph_read() {
    // model.r held storage 1 (0x20_0000) at the last walk and storage 0 (0x10_0000) when
    // bs1 was captured; storage 2 (0x30_0000) it held in between, and no graph read it.
    let mut b = ManifestBuilder::new(producer());
    let mut numbered = |base: u64, n: u32, alive| {
        let mut s = spec(base, 0, 0x1000, 0x1000);
        (s.storage, s.alive) = (Some(n), Some(alive));
        b.add_tensor(s).unwrap()
    };
    let now = numbered(0x20_0000, 1, (1, None));
    let was = numbered(0x10_0000, 0, (0, None));
    let between = numbered(0x30_0000, 2, (1, None));
    let plain = b.add_tensor(spec(0x40_0000, 0, 0x1000, 0x1000)).unwrap();
    for t in [now, was, between] {
        b.add_owner("model.r", t, Registration::Parameter, None)
            .unwrap();
    }
    // An unnumbered tensor, or one of a number the path already holds, is the path twice.
    assert!(matches!(
        b.add_owner("model.r", plain, Registration::Parameter, None),
        Err(BuildError::DuplicateOwner { .. })
    ));
    b.add_owner("model.p", plain, Registration::Parameter, None)
        .unwrap();
    assert!(matches!(
        b.add_owner("model.p", now, Registration::Parameter, None),
        Err(BuildError::DuplicateOwner { .. })
    ));
    let seg = |base| Some((base, 0x1000));
    b.add_graph(
        "bs1",
        None,
        one_node("k", vec![word(0, 0, 0x10_0000, seg(0x10_0000))]),
    );
    b.add_graph(
        "bs8",
        None,
        one_node("k", vec![word(0, 0, 0x20_0000, seg(0x20_0000))]),
    );
    let m = b.finish().unwrap();
    let held: Vec<TensorId> = m
        .owners
        .iter()
        .filter(|o| o.path == "model.r")
        .map(|o| o.tensor)
        .collect();
    // What the path holds now, and what bs1 read; not the storage no graph read.
    assert_eq!(held, [now, was]);
    let read: Vec<Option<TensorId>> = m
        .graphs
        .iter()
        .map(|g| g.nodes[0].touches[0].tensor)
        .collect();
    assert_eq!(read, [Some(was), Some(now)]);
}
