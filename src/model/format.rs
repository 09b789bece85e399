//! The in-memory model of manifests and live snapshots, the same whatever format version a
//! document was read in, and format version 1 of the on-disk contract: every record here
//! serializes as format 1 writes it. Format 2 ([`crate::codec::v2`]) stores the big
//! tables as columns; check and present see only these types.
//!
//! A *manifest* is written at capture: what every node of every captured graph holds,
//! resolved to allocations, tensor views and their owners. A *live snapshot* is written
//! after sleep/wake or a reload: the same walk of the live model, plus a probe of every
//! address the manifest captured. Both are JSON objects whose first two keys are
//! `format_version` and `kind`.
//!
//! Rules of the contract (see `docs/format.md`, "What the documents hold"):
//! - `format_version` changes on any change a reader of the previous version would
//!   misread; adding an optional field does not change it, and readers ignore fields they
//!   do not know. This build reads [`crate::model::version::FORMAT_VERSIONS`] and writes [`FORMAT_VERSION`] unless
//!   asked for another.
//! - Every enum is `snake_case`, every key is `snake_case`.
//! - Device addresses are strings of hexadecimal digits with a `0x` prefix, because JSON
//!   numbers above 2^53 lose precision in most readers.
//! - Records refer to one another by integer ids, unique per record type.

use std::collections::BTreeMap;
use std::fmt;

use crate::model::owner_path::OwnerPath;
use crate::model::version::FORMAT_VERSION;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A device virtual address, written as `"0x7f3a00000000"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Addr(pub u64);

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl Addr {
    /// Parses `0x…` hexadecimal (the format's spelling) or plain decimal.
    pub fn parse(s: &str) -> Option<Addr> {
        let s = s.trim();
        if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
            if hex.is_empty() || hex.len() > 16 {
                return None;
            }
            u64::from_str_radix(hex, 16).ok().map(Addr)
        } else {
            s.parse().ok().map(Addr)
        }
    }

    /// Parses the format's spelling only: `0x` and 1 to 16 hexadecimal digits.
    pub fn parse_strict(s: &str) -> Option<Addr> {
        s.strip_prefix("0x").and_then(hex_digits).map(Addr)
    }

    /// `self + n`, or `None` past the end of the address space.
    pub fn checked_add(self, n: u64) -> Option<Addr> {
        self.0.checked_add(n).map(Addr)
    }
}

impl Serialize for Addr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Formatting into a stack buffer keeps million-touch documents allocation-free here.
        let mut buf = [0u8; 18];
        let n = write_hex(self.0, &mut buf);
        s.serialize_str(std::str::from_utf8(&buf[..n]).expect("hex digits are ASCII"))
    }
}

fn write_hex(mut v: u64, buf: &mut [u8; 18]) -> usize {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut tmp = [0u8; 16];
    let mut i = 0;
    loop {
        tmp[i] = DIGITS[(v & 0xf) as usize];
        i += 1;
        v >>= 4;
        if v == 0 {
            break;
        }
    }
    buf[0] = b'0';
    buf[1] = b'x';
    for j in 0..i {
        buf[2 + j] = tmp[i - 1 - j];
    }
    2 + i
}

impl<'de> Deserialize<'de> for Addr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Addr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a device address as a \"0x\"-prefixed hexadecimal string")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Addr, E> {
                Addr::parse_strict(v)
                    .ok_or_else(|| E::invalid_value(serde::de::Unexpected::Str(v), &self))
            }
        }
        d.deserialize_str(V)
    }
}

/// The value of 1 to 16 hexadecimal digits and nothing else: exactly the schema's
/// `[0-9a-fA-F]{1,16}`. (`u64::from_str_radix` alone also takes a leading `+`, which the
/// schema rejects.)
fn hex_digits(hex: &str) -> Option<u64> {
    if hex.is_empty() || hex.len() > 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

impl JsonSchema for Addr {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Addr".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A device virtual address: \"0x\" and 1 to 16 hexadecimal digits (written lowercase).",
            "type": "string",
            "pattern": "^0x[0-9a-fA-F]{1,16}$"
        })
    }
}

macro_rules! id_type {
    ($(#[$m:meta])* $name:ident, $prefix:literal) => {
        $(#[$m])*
        #[derive(
            Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
        )]
        #[serde(transparent)]
        pub struct $name(pub u32);

        impl crate::model::ids::RawId for $name {
            fn raw(self) -> u32 {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id_type!(
    /// Id of a [`Pool`], unique within one document.
    PoolId,
    "pool"
);
id_type!(
    /// Id of an [`Allocation`], unique within one document.
    AllocationId,
    "alloc"
);
id_type!(
    /// Id of a [`Tensor`] (one storage view), unique within one document.
    TensorId,
    "tensor"
);
id_type!(
    /// Id of a [`Graph`], unique within one manifest.
    GraphId,
    "graph"
);

/// Which of the two documents a file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DocKind {
    /// Written at capture.
    Manifest,
    /// Written after sleep/wake or a reload.
    Live,
}

impl fmt::Display for DocKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DocKind::Manifest => "manifest",
            DocKind::Live => "live",
        })
    }
}

mod producer;
pub use producer::Producer;

/// How a pool's memory fares when the engine sleeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SleepPolicy {
    /// Not managed by a sleep allocator: stays mapped and intact.
    Untouched,
    /// Released at sleep and brought back with its contents (host copy, or reload of
    /// parameters and buffers), like vLLM's `weights` tag.
    Restored,
    /// Released at sleep and mapped again with undefined contents, like vLLM's `kv_cache`
    /// tag: no persistent tensor may live here.
    Discarded,
}

/// What a pool is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PoolKind {
    /// The allocator's default pool.
    Default,
    /// A CUDA graph's private pool: its memory holds graph intermediates.
    Graph,
    /// Model weights and everything derived from them.
    Weights,
    /// The KV cache.
    KvCache,
    /// Any other named pool.
    Other,
}

/// A memory pool of the allocator (a `torch.cuda.MemPool`, a sleep-allocator tag, a
/// graph pool).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Pool {
    pub id: PoolId,
    /// A human name, e.g. `weights`, `kv_cache`, `graph(1, 0)`.
    pub name: String,
    pub kind: PoolKind,
    pub sleep: SleepPolicy,
}

/// One allocation of the driver or the allocator: the range `[base, base + size)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Allocation {
    pub id: AllocationId,
    pub base: Addr,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolId>,
}

/// A content digest, `<algorithm>:<lowercase hex>`, e.g. `sum64:00ff…`. Two digests are
/// compared only when their algorithms agree.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct Digest(pub String);

impl Digest {
    /// The part before the first `:`.
    pub fn algorithm(&self) -> &str {
        self.0.split_once(':').map_or("", |(a, _)| a)
    }
}

/// The digest of a range of device memory that graphs read but no owner explains: the
/// allocator block holding an address of an `unowned` finding (a module-global cache a
/// kernel reads), taken when the document was made. `addr` and `size` are the block's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RangeDigest {
    pub addr: Addr,
    pub size: u64,
    pub digest: Digest,
}

/// One Python frame of the allocation site of a tensor's block (from PyTorch's memory
/// history), innermost first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Frame {
    pub filename: String,
    pub line: u32,
    pub name: String,
}

/// One storage view: the unit graphcheck classifies. Two owners of the same view (an
/// alias) share one tensor record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Tensor {
    pub id: TensorId,
    /// Start of the untyped storage.
    pub storage_base: Addr,
    /// Bytes in the storage.
    pub storage_nbytes: u64,
    /// Bytes from `storage_base` to the view's first element (`storage_offset() *
    /// element_size()` in PyTorch).
    pub offset: u64,
    /// Bytes the view spans from its first element (0 for an empty view).
    pub nbytes: u64,
    pub shape: Vec<u64>,
    /// In elements, as PyTorch reports it.
    pub stride: Vec<i64>,
    /// The element type without the framework's prefix, e.g. `bfloat16`, `float8_e4m3fn`.
    pub dtype: String,
    /// Bytes per element.
    pub itemsize: u32,
    /// e.g. `cuda:0`.
    pub device: String,
    /// The driver allocation that holds the storage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<AllocationId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolId>,
    /// Digest of the view's contents, where asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<Digest>,
    /// Live snapshots only: the digest a fresh load gives at this tensor's owner paths
    /// (the contents it must hold). A differing `digest` is `stale`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_digest: Option<Digest>,
    /// Where the storage was allocated, where the producer knew it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alloc_site: Vec<Frame>,
    /// Which storage object holds the view, numbered within the document, where two
    /// storages held the same memory at different captures (one died, the allocator gave
    /// its block to the next): records of one number share a storage, records of two
    /// numbers are different storages whatever their addresses. Absent, a storage is known
    /// by its base and size alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<u32>,
}

impl Tensor {
    /// The address of the view's first element.
    pub fn data_ptr(&self) -> Addr {
        Addr(self.storage_base.0.wrapping_add(self.offset))
    }

    /// End (exclusive) of the bytes the view spans; an empty view spans one byte so that
    /// a kernel holding its pointer still resolves to it.
    pub fn end(&self) -> Addr {
        Addr(self.data_ptr().0.saturating_add(self.nbytes.max(1)))
    }

    /// Whether `addr` lies in the view's span.
    pub fn contains(&self, addr: Addr) -> bool {
        self.data_ptr() <= addr && addr < self.end()
    }

    /// Whether `other` may be a view of this tensor's storage object by what the document
    /// numbers (`storage`): where both are numbered, the numbers agree; else nothing says no.
    pub fn same_storage_object(&self, other: &Tensor) -> bool {
        match (self.storage, other.storage) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        }
    }

    /// The identity of a storage view: two tensors with equal keys are one view.
    pub fn view_key(&self) -> ViewKey<'_> {
        ViewKey {
            data_ptr: self.data_ptr(),
            shape: &self.shape,
            stride: &self.stride,
            dtype: &self.dtype,
        }
    }

    /// Shape, stride and dtype as one string, e.g. `bfloat16[4096, 128] stride [128, 1]`.
    pub fn layout(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(u64::to_string).collect();
        let strides: Vec<String> = self.stride.iter().map(i64::to_string).collect();
        format!(
            "{}[{}] stride [{}]",
            self.dtype,
            dims.join(", "),
            strides.join(", ")
        )
    }

    /// Whether the two are the same view in every field a kernel depends on: shape,
    /// stride, dtype, itemsize, offset, byte span and device (addresses aside).
    pub fn same_layout(&self, other: &Tensor) -> bool {
        self.shape == other.shape
            && self.stride == other.stride
            && self.dtype == other.dtype
            && self.itemsize == other.itemsize
            && self.offset == other.offset
            && self.nbytes == other.nbytes
            && self.device == other.device
    }
}

/// See [`Tensor::view_key`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ViewKey<'a> {
    pub data_ptr: Addr,
    pub shape: &'a [u64],
    pub stride: &'a [i64],
    pub dtype: &'a str,
}

/// How an owner path holds its tensor: the last hop of the path.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Registration {
    /// `nn.Module._parameters`.
    Parameter,
    /// `nn.Module._buffers`, persistent (in `state_dict()`).
    Buffer,
    /// `nn.Module._buffers`, non-persistent.
    BufferNonPersistent,
    /// Listed by a holder's `persistent_tensors()` or registered as `_held_*` on its module.
    Held,
    /// A plain attribute of an `nn.Module`.
    ModuleAttribute,
    /// An attribute of an object that is not a module (quant method, kernel object).
    ObjectAttribute,
    /// An element of a dict, list or tuple.
    Container,
    /// An argument or keyword of a `functools.partial`.
    Partial,
    /// A closure cell of a function.
    Closure,
    /// An input the caller fills before each replay.
    GraphInput,
    /// An intermediate in a graph's private pool.
    GraphPool,
    /// Declared runtime state (KV cache, per-step scratch): exempt from persistence rules.
    RuntimeState,
}

impl Registration {
    /// Parameters, buffers and held tensors: what sleep level 2 and weight reload restore.
    pub fn is_registered(self) -> bool {
        matches!(
            self,
            Registration::Parameter
                | Registration::Buffer
                | Registration::BufferNonPersistent
                | Registration::Held
        )
    }

    /// Whether the tensor must survive sleep/wake and reload with its address and contents:
    /// everything but graph inputs, graph intermediates and declared runtime state.
    pub fn is_persistent(self) -> bool {
        !matches!(
            self,
            Registration::GraphInput | Registration::GraphPool | Registration::RuntimeState
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Registration::Parameter => "parameter",
            Registration::Buffer => "buffer",
            Registration::BufferNonPersistent => "buffer_non_persistent",
            Registration::Held => "held",
            Registration::ModuleAttribute => "module_attribute",
            Registration::ObjectAttribute => "object_attribute",
            Registration::Container => "container",
            Registration::Partial => "partial",
            Registration::Closure => "closure",
            Registration::GraphInput => "graph_input",
            Registration::GraphPool => "graph_pool",
            Registration::RuntimeState => "runtime_state",
        }
    }
}

impl fmt::Display for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One path through which the model reaches a tensor, e.g.
/// `model.layers[3].mlp.quant_method.kernel.workspace` (grammar: [`crate::model::owner_path`], in the `graphcheck` crate).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Owner {
    #[schemars(with = "String")]
    pub path: OwnerPath,
    pub tensor: TensorId,
    pub registration: Registration,
    /// The type of the object holding the last hop, e.g. `MarlinLinearKernel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
}

/// The type of a graph node graphcheck reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum NodeKind {
    Kernel,
    Memset,
    Memcpy,
    // A graph memory-allocation node (`cudaMallocAsync` captured): its touch is the
    // memory it allocates. (Plain comments: a doc comment turns the schema's enum into a
    // `oneOf`.)
    MemAlloc,
    // A graph memory-free node: its touch is the memory it frees.
    MemFree,
}

impl fmt::Display for NodeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeKind::Kernel => "kernel",
            NodeKind::Memset => "memset",
            NodeKind::Memcpy => "memcpy",
            NodeKind::MemAlloc => "mem_alloc",
            NodeKind::MemFree => "mem_free",
        })
    }
}

/// One word of a node's parameters that holds a device address.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Touch {
    /// Parameter index (kernels), or 0 = destination, 1 = source (memset, memcpy).
    pub param: u32,
    /// Byte offset of the word inside that parameter (a pointer inside a by-value struct
    /// has a nonzero offset).
    pub offset: u32,
    pub addr: Addr,
    /// The tensor view the address lies in, where one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor: Option<TensorId>,
    /// The allocation the address lies in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<AllocationId>,
}

/// Why a word that looked like a device address is not a touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum IgnoredReason {
    /// The word is in the index part of a by-value struct whose layout the kernel's
    /// signature gives: the `sizes`/`strides` of torch's `TensorInfo`, or an
    /// `OffsetCalculator` (alone, or at the head of an elementwise kernel's closure).
    /// Indices, never addresses; torch leaves the slots beyond the tensor's dimensions
    /// unset, so they hold stale bytes.
    IndexSlot,
    /// The word is inside a by-value struct (offset > 0), names no tensor, and points into
    /// memory the caching allocator held free, outside any graph pool, when the manifest
    /// was built: stale bytes in an unset slot (torch's `OffsetCalculator` sets only
    /// `dims` of its 25 entries), which no correct kernel reads.
    FreeMemory,
    /// The word is the `seed_` or `offset_` of a parameter the kernel's signature types as
    /// torch's `at::PhiloxCudaState` (offsets 0 and 8): under capture, pointers to the CUDA
    /// generator's graph-safe state (`seed_extragraph_`, `offset_extragraph_`), one-element
    /// tensors torch owns, reaches from no Python object, and refills before every replay.
    /// A known owner, not an unowned address.
    RngState,
    /// The word is `comm` (offset 0) of the `ncclDevKernelArgsStorage<N>` parameter of an
    /// NCCL collective kernel: a pointer to the communicator's device state, memory NCCL
    /// maps and owns for the communicator's life (seen on two H200s, TP=2). Owned by the
    /// communicator, not an unowned address; the user buffers in the same parameter are
    /// touches as usual.
    NcclComm,
}

/// A parameter word that held a device address but is not a touch (`docs/findings.md`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct IgnoredWord {
    pub param: u32,
    pub offset: u32,
    pub addr: Addr,
    pub reason: IgnoredReason,
}

/// One node of a captured graph that holds addresses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Node {
    /// Position in the walk of the graph (child-graph bodies follow their parent node).
    pub index: u32,
    pub kind: NodeKind,
    /// Demangled kernel name, or `memset` / `memcpy`.
    pub name: std::sync::Arc<str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grid: Option<[u32; 3]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<[u32; 3]>,
    /// The index of the child-graph (or conditional) node whose body holds this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<u32>,
    /// Why the parameters could not be read; such a node has no touches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opaque: Option<String>,
    #[serde(default)]
    pub touches: Vec<Touch>,
    /// Words that looked like addresses but are not touches, and why; kept so that nothing
    /// is dropped silently.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignored: Vec<IgnoredWord>,
}

/// A node whose type graphcheck does not read, counted so that nothing is skipped silently.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Unread {
    pub index: u32,
    /// The driver's node type, by name where known, else its number.
    pub node_type: String,
    pub reason: String,
}

/// One captured graph.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Graph {
    pub id: GraphId,
    /// e.g. `decode_bs8`.
    pub name: String,
    /// The graph's private pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolId>,
    /// Nodes by driver type (`kernel`, `memset`, `memcpy`, `event_record`, `child_graph`,
    /// …), unread types included.
    pub node_counts: BTreeMap<String, u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unread: Vec<Unread>,
    /// Static inputs torch's CUDA-graph trees guard for this graph: where one of `paths`
    /// holds a tensor at another address than `addr`, torch records a new graph instead of
    /// replaying this one, which verify then leaves out (`superseded`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub guards: Vec<Guard>,
    /// The retargets applied to this graph since its capture (`docs/retarget.md`), in
    /// order: its words, as recorded, are the patched ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retargets: Vec<RetargetRecord>,
    pub nodes: Vec<Node>,
}

mod graph_records;
pub use graph_records::{Guard, RetargetRecord};

/// The state of the allocator at an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AllocState {
    /// Inside a block the allocator has handed out.
    Active,
    /// Mapped, but in a free block of the allocator (cached, not handed out).
    Free,
    /// Not mapped at all (returned to the driver, or released by sleep).
    Unmapped,
}

/// What is at one captured address now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Probe {
    pub addr: Addr,
    pub state: AllocState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<AllocationId>,
}

/// Whether the event between capture and snapshot may change contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Contents {
    /// Sleep/wake, or a reload of the same weights: every persistent tensor must hold what
    /// it held at capture.
    Preserved,
    /// A reload of new weights: contents may change; where a tensor carries a
    /// `reference_digest`, it must equal it.
    Updated,
}

/// The event between capture and snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Event {
    /// Free text, e.g. `sleep(level=2) + wake + reload_weights()`.
    pub name: String,
    pub contents: Contents,
}

/// The document written at capture.
// Serializing writes the layout of its `format_version` (`crate::codec::encode`);
// `Deserialize` and the `JsonSchema` read and describe format 1's layout, which is these
// types record for record. `crate::codec::load` reads either version. (Plain comments:
// doc comments here are the schema's descriptions.)
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Manifest {
    /// Always 1.
    // In memory: the version the document was read in, and is written in, 1 or 2 (new
    // documents get `FORMAT_VERSION`). Format 1's schema says 1, as the loader does: a
    // document of another version is not a valid v1 document, whatever its body.
    #[schemars(extend("const" = 1))]
    pub format_version: u32,
    /// Always `manifest`.
    #[schemars(extend("const" = "manifest"))]
    pub kind: DocKind,
    pub producer: Producer,
    #[serde(default)]
    pub pools: Vec<Pool>,
    #[serde(default)]
    pub allocations: Vec<Allocation>,
    pub tensors: Vec<Tensor>,
    pub owners: Vec<Owner>,
    pub graphs: Vec<Graph>,
    /// The contents of the memory the graphs read that no owner explains, where digests
    /// were taken.
    #[serde(default)]
    pub ranges: Vec<RangeDigest>,
}

impl Manifest {
    /// An empty manifest of this format version.
    pub fn new(producer: Producer) -> Manifest {
        Manifest {
            format_version: FORMAT_VERSION,
            kind: DocKind::Manifest,
            producer,
            pools: Vec::new(),
            allocations: Vec::new(),
            tensors: Vec::new(),
            owners: Vec::new(),
            graphs: Vec::new(),
            ranges: Vec::new(),
        }
    }
}

/// The document written after sleep/wake or a reload.
// Serialized and read as `Manifest` is.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Live {
    /// Always 1.
    // In memory: the version the document was read in, and is written in (see `Manifest`).
    #[schemars(extend("const" = 1))]
    pub format_version: u32,
    /// Always `live`.
    #[schemars(extend("const" = "live"))]
    pub kind: DocKind,
    pub producer: Producer,
    pub event: Event,
    #[serde(default)]
    pub pools: Vec<Pool>,
    #[serde(default)]
    pub allocations: Vec<Allocation>,
    pub tensors: Vec<Tensor>,
    pub owners: Vec<Owner>,
    /// One per distinct address the manifest's graphs hold.
    pub probes: Vec<Probe>,
    /// The manifest's `ranges` digested again, where their memory is mapped.
    #[serde(default)]
    pub ranges: Vec<RangeDigest>,
}

impl Live {
    /// An empty live snapshot of this format version.
    pub fn new(producer: Producer, event: Event) -> Live {
        Live {
            format_version: FORMAT_VERSION,
            kind: DocKind::Live,
            producer,
            event,
            pools: Vec::new(),
            allocations: Vec::new(),
            tensors: Vec::new(),
            owners: Vec::new(),
            probes: Vec::new(),
            ranges: Vec::new(),
        }
    }
}

mod either;
pub use either::Document;

#[cfg(test)]
mod tests;
