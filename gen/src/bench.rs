//! The benchmark documents: a manifest and a live snapshot of a large model (by default
//! 100,000 tensors, 64 graphs, 1,000,000 touches) after a reload that moved, freed, reused,
//! reshaped, staled and removed a small fraction of what the graphs read, so that `verify`
//! has real work and real findings. Built directly, in one pass, without the allocator
//! model the fixtures use (its best-fit search is quadratic).

use std::collections::HashMap;
use std::io::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::Context as _;
use graphcheck::model::format::{
    Addr, AllocState, Allocation, AllocationId, Contents, Event, Graph, GraphId, Live, Manifest,
    Node, NodeKind, Owner, Pool, PoolId, PoolKind, Probe, Registration, SleepPolicy, Tensor,
    TensorId, Touch,
};
use graphcheck::model::owner_path::OwnerPath;

use crate::doc::{digest, producer};
use crate::heap::{BLOCK_ROUND, SEGMENT_ROUND, SMALL_REQUEST, SMALL_SEGMENT, round_up};
use crate::model;

/// What to generate.
#[derive(Clone, Copy, Debug)]
pub struct BenchOpts {
    pub touches: u64,
    pub tensors: u64,
    pub graphs: u32,
    pub seed: u64,
    /// How many times the default share of tensors the documents make findings of: plain
    /// attributes (1% of tensors at 1.0) and tensors the reload changes (0.62%). The report
    /// benchmark raises it to get tens of thousands of findings from documents of a size
    /// that loads in well under a second.
    pub changes: f64,
    /// The format version the documents are written in.
    pub format_version: u32,
}

impl Default for BenchOpts {
    fn default() -> Self {
        BenchOpts {
            touches: 1_000_000,
            tensors: 100_000,
            graphs: 64,
            seed: 1,
            changes: 1.0,
            format_version: graphcheck::model::version::FORMAT_VERSION,
        }
    }
}

/// What happened to a tensor at the reload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Same,
    /// Rebound to a new tensor; the old block is free in the allocator's cache.
    DriftFree,
    /// Rebound; the old segment was returned to the driver.
    DriftUnmapped,
    /// Rebound; another owner's new tensor now sits at the old address.
    DriftReused,
    /// Rebound into the old block of a `DriftReused` tensor; its own old block is free.
    DriftIntoReused,
    Reshaped,
    Stale,
    Vanished,
}

/// Counts of what was generated.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub tensors: usize,
    pub owners: usize,
    pub touches: usize,
    pub nodes: usize,
    pub probes: usize,
    pub allocations: usize,
    pub plain_attributes: usize,
    pub aliases: usize,
    pub drift_free: usize,
    pub drift_unmapped: usize,
    pub drift_reused: usize,
    pub reshaped: usize,
    pub stale: usize,
    pub vanished: usize,
    pub mispooled: usize,
    pub unowned_allocations: usize,
}

/// The two documents and their counts.
pub struct Bench {
    pub manifest: Manifest,
    pub live: Live,
    pub stats: Stats,
}

/// splitmix64: small, fast, and the same sequence on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// A uniform number in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

const DEFAULT: usize = 0;
const WEIGHTS: usize = 1;
const KV: usize = 2;
const GRAPH: usize = 3;

/// Segments laid out per pool: small requests share 2 MiB segments, larger ones get
/// their own, rounded to 2 MiB.
struct Layout {
    allocations: Vec<Allocation>,
    next_base: [u64; 4],
    small: [Option<(usize, u64)>; 4],
}

impl Layout {
    fn new() -> Layout {
        Layout {
            allocations: Vec::new(),
            next_base: [
                0x7f80_0000_0000,
                0x7a00_0000_0000,
                0x7e00_0000_0000,
                0x7f00_0000_0000,
            ],
            small: [None; 4],
        }
    }

    fn segment(&mut self, pool: usize, size: u64) -> usize {
        let base = self.next_base[pool];
        self.next_base[pool] = base + size;
        self.allocations.push(Allocation {
            id: AllocationId(self.allocations.len() as u32),
            base: Addr(base),
            size,
            pool: Some(PoolId(pool as u32)),
        });
        self.allocations.len() - 1
    }

    /// Places `nbytes` in `pool`; returns the segment index and the address.
    fn place(&mut self, pool: usize, nbytes: u64) -> (usize, u64) {
        let size = round_up(nbytes.max(1), BLOCK_ROUND);
        if size > SMALL_REQUEST {
            let s = self.segment(pool, round_up(size, SEGMENT_ROUND));
            return (s, self.allocations[s].base.0);
        }
        let (s, used) = match self.small[pool] {
            Some((s, used)) if used + size <= SMALL_SEGMENT => (s, used),
            _ => (self.segment(pool, SMALL_SEGMENT), 0),
        };
        self.small[pool] = Some((s, used + size));
        (s, self.allocations[s].base.0 + used)
    }
}

fn pools() -> Vec<Pool> {
    let pool = |id: usize, name: &str, kind, sleep| Pool {
        id: PoolId(id as u32),
        name: name.into(),
        kind,
        sleep,
    };
    vec![
        pool(
            DEFAULT,
            "default",
            PoolKind::Default,
            SleepPolicy::Untouched,
        ),
        pool(WEIGHTS, "weights", PoolKind::Weights, SleepPolicy::Restored),
        pool(KV, "kv_cache", PoolKind::KvCache, SleepPolicy::Discarded),
        pool(
            GRAPH,
            "graph(1, 0)",
            PoolKind::Graph,
            SleepPolicy::Untouched,
        ),
    ]
}

const DTYPES: [(&str, u32); 4] = [
    ("bfloat16", 2),
    ("float8_e4m3fn", 1),
    ("float32", 4),
    ("int32", 4),
];

/// Kernel names the nodes cycle through: (name, packed parameter buffer?).
const KERNELS: [(&str, bool); 10] = [
    (model::RMS_NORM, false),
    ("nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNT", true),
    (model::ROTARY, false),
    (model::RESHAPE_AND_CACHE, false),
    (model::FLASH_FWD, true),
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT", true),
    (model::FUSED_ADD_RMS_NORM, false),
    ("fused_moe_kernel", false),
    (model::SILU_AND_MUL, false),
    (model::CUTLASS_FP8_GEMM, true),
];

fn tensor(id: u32, pool: usize, alloc: usize, base: u64, dtype: (&str, u32), elems: u64) -> Tensor {
    let nbytes = elems * u64::from(dtype.1);
    let (shape, stride) = if elems % 128 == 0 && elems > 128 {
        (vec![elems / 128, 128], vec![128, 1])
    } else {
        (vec![elems], vec![1])
    };
    Tensor {
        id: TensorId(id),
        storage_base: Addr(base),
        storage_nbytes: nbytes,
        offset: 0,
        nbytes,
        shape,
        stride,
        dtype: dtype.0.into(),
        itemsize: dtype.1,
        device: "cuda:0".into(),
        allocation: Some(AllocationId(alloc as u32)),
        pool: Some(PoolId(pool as u32)),
        digest: None,
        reference_digest: None,
        alloc_site: Vec::new(),
        storage: None,
    }
}

/// Generates both documents.
pub fn generate(opts: BenchOpts) -> Bench {
    let mut rng = Rng(opts.seed ^ 0x6772_6170_6863_6b31);
    let mut layout = Layout::new();
    let mut stats = Stats::default();
    let n = opts.tensors.max(32) as usize;
    let layers = 64usize;
    let per_layer = n.div_ceil(layers);

    let mut tensors: Vec<Tensor> = Vec::with_capacity(n);
    let mut owners: Vec<Owner> = Vec::with_capacity(n + n / 500);
    // Index of each tensor's first owner; whether it may change at the reload.
    let mut first_owner: Vec<usize> = Vec::with_capacity(n);
    let mut mutable: Vec<bool> = Vec::with_capacity(n);
    for i in 0..n {
        let layer = i / per_layer;
        let (registration, pool, path, holder) = if i < 16 {
            (
                Registration::GraphInput,
                DEFAULT,
                format!("runner.input_buffers[{i}]"),
                "GPUModelRunner",
            )
        } else if i % 100 == 17 {
            (
                Registration::RuntimeState,
                KV,
                format!("model.layers[{layer}].self_attn.attn.kv_cache[{i}]"),
                "list",
            )
        } else if i % 10_007 == 5003 {
            stats.mispooled += 1;
            (
                Registration::BufferNonPersistent,
                KV,
                format!("model.layers[{layer}].self_attn.attn.scales[{i}]._k_scale"),
                "Attention",
            )
        } else {
            let roll = rng.unit();
            // At the default scale of 1.0 these are the bounds 0.005 and 0.01 exactly.
            let plain = 0.01 * opts.changes;
            if roll < plain / 2.0 {
                stats.plain_attributes += 1;
                (
                    Registration::ObjectAttribute,
                    WEIGHTS,
                    format!("model.layers[{layer}].mlp.experts[{i}].quant_method.kernel.workspace"),
                    "MarlinLinearKernel",
                )
            } else if roll < plain {
                stats.plain_attributes += 1;
                (
                    Registration::ModuleAttribute,
                    WEIGHTS,
                    format!("model.layers[{layer}].mlp.experts[{i}].g_idx_sort_indices"),
                    "FusedMoE",
                )
            } else if roll < plain.max(0.15) {
                (
                    Registration::BufferNonPersistent,
                    WEIGHTS,
                    format!("model.layers[{layer}].mlp.experts[{i}].e_score_correction_bias"),
                    "FusedMoE",
                )
            } else {
                let name = [
                    "w13_weight",
                    "w2_weight",
                    "w13_weight_scale",
                    "w2_weight_scale",
                ][i % 4];
                (
                    Registration::Parameter,
                    WEIGHTS,
                    format!("model.layers[{layer}].mlp.experts[{i}].{name}"),
                    "FusedMoE",
                )
            }
        };
        let dtype = DTYPES[rng.below(DTYPES.len() as u64) as usize];
        // Four in five tensors are small (norms, scales, indices); the rest 1-8 MiB.
        let nbytes = if pool == KV && registration == Registration::RuntimeState {
            8 << 20
        } else if rng.below(5) == 0 {
            (1 << 20) + 512 + rng.below(7 << 20)
        } else {
            512 + rng.below(256 << 10)
        };
        let elems = (nbytes / u64::from(dtype.1)).div_ceil(128) * 128;
        let (alloc, base) = layout.place(pool, elems * u64::from(dtype.1));
        let mut t = tensor(i as u32, pool, alloc, base, dtype, elems);
        if registration.is_persistent() {
            t.digest = Some(digest(t.id, 0));
        }
        tensors.push(t);
        first_owner.push(owners.len());
        owners.push(Owner {
            path: OwnerPath::parse(&path).expect("the generator writes valid owner paths"),
            tensor: TensorId(i as u32),
            registration,
            holder: Some(holder.into()),
        });
        let mut may_change = pool == WEIGHTS;
        if registration == Registration::Parameter && rng.below(1000) == 0 {
            stats.aliases += 1;
            owners.push(Owner {
                path: OwnerPath::parse(&format!(
                    "model.layers[{layer}].mlp.shared_experts[{i}].weight"
                ))
                .expect("the generator writes valid owner paths"),
                tensor: TensorId(i as u32),
                registration: Registration::Parameter,
                holder: Some("SharedFusedMoE".into()),
            });
            may_change = false;
        }
        mutable.push(may_change);
    }
    // Module-level globals no owner reaches: a few default-pool allocations.
    let globals: Vec<(usize, u64)> = (0..3).map(|_| layout.place(DEFAULT, 2 << 20)).collect();
    stats.unowned_allocations = globals.len();

    let graphs = build_graphs(opts, &mut rng, &mut layout, &tensors, &globals);
    let mut manifest = Manifest::new(producer());
    manifest.pools = pools();
    manifest.allocations = layout.allocations.clone();
    manifest.tensors = tensors;
    manifest.owners = owners;
    manifest.graphs = graphs;

    let live = reload(
        opts.changes,
        &manifest,
        &first_owner,
        &mutable,
        &mut rng,
        &mut layout,
        &mut stats,
    );
    stats.tensors = manifest.tensors.len();
    stats.owners = manifest.owners.len();
    stats.nodes = manifest.graphs.iter().map(|g| g.nodes.len()).sum();
    stats.touches = manifest
        .graphs
        .iter()
        .flat_map(|g| &g.nodes)
        .map(|nd| nd.touches.len())
        .sum();
    stats.probes = live.probes.len();
    stats.allocations = manifest.allocations.len();
    Bench {
        manifest,
        live,
        stats,
    }
}

fn build_graphs(
    opts: BenchOpts,
    rng: &mut Rng,
    layout: &mut Layout,
    tensors: &[Tensor],
    globals: &[(usize, u64)],
) -> Vec<Graph> {
    let g_count = opts.graphs.max(1) as u64;
    let mut graphs = Vec::with_capacity(g_count as usize);
    for g in 0..g_count {
        let bs = g + 1;
        let mut quota = opts.touches / g_count + u64::from(g < opts.touches % g_count);
        // Graph-pool intermediates of this batch size.
        let scratch: Vec<(usize, u64)> = (0..256)
            .map(|k| layout.place(GRAPH, bs * 2048 * 2 * (1 + k % 3)))
            .collect();
        let mut nodes = Vec::new();
        let mut counts = std::collections::BTreeMap::new();
        while quota > 0 {
            let k = (2 + rng.below(5)).min(quota);
            quota -= k;
            let index = nodes.len() as u32;
            let (name, packed) = KERNELS[index as usize % KERNELS.len()];
            let mut touches = Vec::with_capacity(k as usize);
            for j in 0..k as u32 {
                let (param, offset) = if packed { (0, 0x148 + 8 * j) } else { (j, 0) };
                let roll = rng.below(10_000);
                let touch = if roll < 2 {
                    let (s, base) = globals[rng.below(globals.len() as u64) as usize];
                    Touch {
                        param,
                        offset,
                        addr: Addr(base + 8 * rng.below(1024)),
                        tensor: None,
                        allocation: Some(AllocationId(s as u32)),
                    }
                } else if roll < 3500 {
                    let (s, base) = scratch[rng.below(scratch.len() as u64) as usize];
                    Touch {
                        param,
                        offset,
                        addr: Addr(base),
                        tensor: None,
                        allocation: Some(AllocationId(s as u32)),
                    }
                } else {
                    let t = &tensors[rng.below(tensors.len() as u64) as usize];
                    let inside = if rng.below(7) == 0 {
                        8 * rng.below(t.nbytes / 8)
                    } else {
                        0
                    };
                    Touch {
                        param,
                        offset,
                        addr: Addr(t.data_ptr().0 + inside),
                        tensor: Some(t.id),
                        allocation: t.allocation,
                    }
                };
                touches.push(touch);
            }
            *counts.entry("kernel".to_string()).or_insert(0) += 1;
            nodes.push(Node {
                index,
                kind: NodeKind::Kernel,
                name: name.into(),
                grid: Some([132, bs as u32, 1]),
                block: Some([256, 1, 1]),
                parent: None,
                opaque: None,
                touches,
                ignored: Vec::new(),
            });
        }
        graphs.push(Graph {
            id: GraphId(g as u32),
            name: format!("decode_bs{bs}"),
            pool: Some(PoolId(GRAPH as u32)),
            node_counts: counts,
            unread: Vec::new(),
            guards: Vec::new(),
            retargets: Vec::new(),
            nodes,
        });
    }
    graphs
}

fn reload(
    changes: f64,
    m: &Manifest,
    first_owner: &[usize],
    mutable: &[bool],
    rng: &mut Rng,
    layout: &mut Layout,
    stats: &mut Stats,
) -> Live {
    let n = m.tensors.len();
    let mut fate = vec![Fate::Same; n];
    let mut pending_reuse: Option<usize> = None;
    for i in 0..n {
        if !mutable[i] {
            continue;
        }
        // Scaled down instead of the bounds scaled up, so that at 1.0 they stay exact.
        let roll = rng.unit() / changes;
        let large = m.tensors[i].storage_nbytes > SMALL_REQUEST;
        fate[i] = if roll < 0.0030 {
            Fate::DriftFree
        } else if roll < 0.0040 {
            if large {
                Fate::DriftUnmapped
            } else {
                Fate::DriftFree
            }
        } else if roll < 0.0050 {
            match pending_reuse.take() {
                None => {
                    pending_reuse = Some(i);
                    Fate::DriftFree
                }
                Some(victim) if m.tensors[i].storage_nbytes <= m.tensors[victim].storage_nbytes => {
                    fate[victim] = Fate::DriftReused;
                    Fate::DriftIntoReused
                }
                Some(_) => Fate::DriftFree,
            }
        } else if roll < 0.0055 {
            Fate::Reshaped
        } else if roll < 0.0060 {
            Fate::Stale
        } else if roll < 0.0062 {
            Fate::Vanished
        } else {
            Fate::Same
        };
    }
    // The thief of each victim: the tensor whose new storage is the victim's old block.
    let mut victim_of: HashMap<usize, usize> = HashMap::new();
    {
        let mut last_victim = None;
        for (i, f) in fate.iter().enumerate() {
            match f {
                Fate::DriftReused => last_victim = Some(i),
                Fate::DriftIntoReused => {
                    victim_of.insert(i, last_victim.take().expect("a victim precedes"));
                }
                _ => {}
            }
        }
    }

    let mut live = Live::new(
        producer(),
        Event {
            name: "reload_weights() with new weights (benchmark)".into(),
            contents: Contents::Updated,
        },
    );
    live.pools = pools();
    let mut unmapped = vec![false; m.allocations.len()];
    let mut next_id = n as u32;
    let mut owners = m.owners.clone();
    let mut vanished_owner = vec![false; owners.len()];
    for (i, t) in m.tensors.iter().enumerate() {
        let persistent = t.digest.is_some();
        let mut keep = t.clone();
        if persistent {
            keep.digest = Some(digest(t.id, 1));
            keep.reference_digest = keep.digest.clone();
        }
        match fate[i] {
            Fate::Same => live.tensors.push(keep),
            Fate::Reshaped => {
                stats.reshaped += 1;
                // A transposed view of the same elements, or a split one; its span as the
                // loader computes it (an odd count loses its last element).
                if keep.shape.len() == 2 {
                    keep.shape = vec![keep.shape[1], keep.shape[0]];
                    keep.stride = vec![1, keep.shape[0] as i64];
                } else {
                    keep.shape = vec![keep.shape[0] / 2, 2];
                    keep.stride = vec![2, 1];
                }
                keep.nbytes =
                    graphcheck::index::refs::view_span(&keep.shape, &keep.stride, keep.itemsize)
                        .expect("a view of the tensor's own elements");
                live.tensors.push(keep);
            }
            Fate::Stale => {
                stats.stale += 1;
                keep.reference_digest = Some(digest(t.id, 7));
                live.tensors.push(keep);
            }
            Fate::Vanished => {
                stats.vanished += 1;
                vanished_owner[first_owner[i]] = true;
            }
            Fate::DriftFree | Fate::DriftUnmapped | Fate::DriftReused | Fate::DriftIntoReused => {
                let mut moved = keep;
                moved.id = TensorId(next_id);
                next_id += 1;
                if let Some(&victim) = victim_of.get(&i) {
                    let v = &m.tensors[victim];
                    moved.storage_base = v.storage_base;
                    moved.allocation = v.allocation;
                    moved.pool = v.pool;
                } else {
                    let (s, base) = layout.place(WEIGHTS, t.storage_nbytes);
                    moved.storage_base = Addr(base);
                    moved.allocation = Some(AllocationId(s as u32));
                }
                moved.digest = Some(digest(moved.id, 1));
                moved.reference_digest = moved.digest.clone();
                owners[first_owner[i]].tensor = moved.id;
                match fate[i] {
                    Fate::DriftUnmapped => {
                        stats.drift_unmapped += 1;
                        let a = t.allocation.expect("placed").0 as usize;
                        unmapped[a] = true;
                    }
                    Fate::DriftReused => stats.drift_reused += 1,
                    _ => stats.drift_free += 1,
                }
                live.tensors.push(moved);
            }
        }
    }
    live.tensors.sort_by_key(|t| t.id);
    live.owners = owners
        .into_iter()
        .zip(vanished_owner)
        .filter(|(_, gone)| !gone)
        .map(|(o, _)| o)
        .collect();
    live.allocations = layout
        .allocations
        .iter()
        .filter(|a| !unmapped.get(a.id.0 as usize).copied().unwrap_or(false))
        .cloned()
        .collect();

    let mut seen = std::collections::HashSet::new();
    for touch in m
        .graphs
        .iter()
        .flat_map(|g| &g.nodes)
        .flat_map(|nd| &nd.touches)
    {
        if !seen.insert(touch.addr) {
            continue;
        }
        let alloc_pool = |a: Option<AllocationId>| {
            a.and_then(|a| layout.allocations.get(a.0 as usize))
                .and_then(|al| al.pool)
        };
        let state = match touch.tensor.map(|t| fate[t.0 as usize]) {
            None | Some(Fate::Same | Fate::Reshaped | Fate::Stale | Fate::DriftReused) => {
                AllocState::Active
            }
            Some(Fate::DriftFree | Fate::DriftIntoReused | Fate::Vanished) => AllocState::Free,
            Some(Fate::DriftUnmapped) => AllocState::Unmapped,
        };
        let (pool, allocation) = if state == AllocState::Unmapped {
            (None, None)
        } else {
            (alloc_pool(touch.allocation), touch.allocation)
        };
        live.probes.push(Probe {
            addr: touch.addr,
            state,
            pool,
            allocation,
        });
    }
    live
}

/// Writes `doc` as compact JSON to `path`, atomically (a temporary file renamed over it).
fn write_json<T: serde::Serialize>(path: &Path, doc: &T) -> anyhow::Result<u64> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = tempfile::Builder::new()
        .prefix(".graphcheck-gen-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .with_context(|| format!("failed to create a temporary file in {}", dir.display()))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, tmp);
    serde_json::to_writer(&mut w, doc)
        .with_context(|| format!("failed to write {}", path.display()))?;
    w.write_all(b"\n")?;
    let tmp = w.into_inner().map_err(|e| e.into_error())?;
    tmp.as_file().sync_all()?;
    let size = tmp.as_file().metadata()?.len();
    tmp.persist(path)
        .map_err(|e| e.error)
        .with_context(|| format!("failed to write {}", path.display()))?;
    Ok(size)
}

/// Generates and writes `DIR/manifest.json` and `DIR/live.json`; reports on stderr.
pub fn run(out: &Path, opts: BenchOpts) -> anyhow::Result<Stats> {
    let start = Instant::now();
    let mut b = generate(opts);
    b.manifest.format_version = opts.format_version;
    b.live.format_version = opts.format_version;
    let generated = start.elapsed().as_secs_f64();
    std::fs::create_dir_all(out).with_context(|| format!("failed to create {}", out.display()))?;
    let mpath = out.join("manifest.json");
    let lpath = out.join("live.json");
    let msize = write_json(&mpath, &b.manifest)?;
    let lsize = write_json(&lpath, &b.live)?;
    let s = &b.stats;
    let mib = |n: u64| n as f64 / f64::from(1 << 20);
    eprintln!(
        "wrote {} (format {}, {:.1} MiB): {} graphs, {} nodes, {} touches, {} tensors, {} owners \
         ({} aliases, {} plain attributes, {} in the KV-cache pool), {} allocations \
         ({} unowned)",
        mpath.display(),
        opts.format_version,
        mib(msize),
        b.manifest.graphs.len(),
        s.nodes,
        s.touches,
        s.tensors,
        s.owners,
        s.aliases,
        s.plain_attributes,
        s.mispooled,
        s.allocations,
        s.unowned_allocations,
    );
    eprintln!(
        "wrote {} ({:.1} MiB): {} probes; reload moved {} tensors ({} old blocks free, {} \
         unmapped, {} reused), reshaped {}, staled {}, removed {}",
        lpath.display(),
        mib(lsize),
        s.probes,
        s.drift_free + s.drift_unmapped + s.drift_reused,
        s.drift_free,
        s.drift_unmapped,
        s.drift_reused,
        s.reshaped,
        s.stale,
        s.vanished,
    );
    eprintln!(
        "in {:.2} s ({:.2} s generating)",
        start.elapsed().as_secs_f64(),
        generated
    );
    Ok(b.stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small benchmark documents pass the loader's validation and contain every fate.
    #[test]
    fn small_bench_is_valid() {
        let b = generate(BenchOpts {
            touches: 20_000,
            tensors: 5_000,
            graphs: 4,
            seed: 3,
            changes: 1.0,
            format_version: 2,
        });
        let m = serde_json::to_vec(&b.manifest).unwrap();
        let l = serde_json::to_vec(&b.live).unwrap();
        let m =
            graphcheck::codec::load::parse_manifest(&m, Path::new("bench/manifest.json")).unwrap();
        graphcheck::codec::load::parse_live(&l, Path::new("bench/live.json")).unwrap();
        assert_eq!(b.stats.touches, 20_000);
        assert_eq!(m.graphs.len(), 4);
        assert_eq!(m.tensors.len(), 5_000);
        assert!(b.stats.plain_attributes > 0 && b.stats.drift_free > 0);
    }

    #[test]
    fn bench_is_deterministic() {
        let opts = BenchOpts {
            touches: 2_000,
            tensors: 500,
            graphs: 2,
            seed: 9,
            changes: 1.0,
            format_version: 2,
        };
        let a = generate(opts);
        let b = generate(opts);
        assert_eq!(a.manifest, b.manifest);
        assert_eq!(a.live, b.live);
    }

    #[test]
    fn bench_writes_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let s = run(
            dir.path(),
            BenchOpts {
                touches: 1_000,
                tensors: 200,
                graphs: 2,
                seed: 1,
                changes: 1.0,
                format_version: 1,
            },
        )
        .unwrap();
        assert_eq!(s.touches, 1_000);
        let m = graphcheck::codec::load::load_manifest(&dir.path().join("manifest.json")).unwrap();
        graphcheck::codec::load::load_live(&dir.path().join("live.json")).unwrap();
        assert_eq!(m.graphs.len(), 2);
    }
}
