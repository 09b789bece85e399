//! Reading captured graphs: borrowed handles ([`GraphRef`], [`NodeRef`]) and what their
//! nodes hold. Handles are borrowed: nothing here creates or destroys a graph, a node or a
//! context (that is [`crate::owned`]).
//!
//! Node types are read into a `u32`, never into cudarc's `#[repr(u32)]` enum: a type from
//! a newer driver would be undefined behaviour there; here it is counted as unread.
//! Driver-written structs are read through `MaybeUninit`: zeroed, written by the driver,
//! and materialized as Rust values only where no field is an enum; structs with enum
//! fields are read field by field through raw pointers, the enums as integers.

use std::ffi::{CStr, c_void};
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::addr_of;

use cudarc::driver::sys;

use crate::raw::{self, Status};
use crate::{DriverError, Error};

/// A graph we read but do not own.
#[derive(Clone, Copy, Debug)]
pub struct GraphRef<'a> {
    raw: sys::CUgraph,
    _life: PhantomData<&'a ()>,
}

impl<'a> GraphRef<'a> {
    /// Borrows the graph a cudarc `CudaGraph` owns, for as long as it is borrowed.
    pub fn of(g: &'a cudarc::driver::CudaGraph) -> GraphRef<'a> {
        GraphRef {
            raw: g.cu_graph(),
            _life: PhantomData,
        }
    }

    /// Borrows a raw graph handle.
    ///
    /// # Safety
    /// `raw` must be a valid `CUgraph` for all of `'a`, neither destroyed nor modified
    /// (nor read by another thread) meanwhile: the driver does not synchronize graphs.
    pub unsafe fn from_raw(raw: sys::CUgraph) -> GraphRef<'a> {
        GraphRef {
            raw,
            _life: PhantomData,
        }
    }

    /// Lends the graph behind a raw handle integer to `f`, for the call only: the handle as
    /// foreign code hands it over (Python's `torch.cuda.CUDAGraph.raw_cuda_graph()`, a C
    /// caller's `cudaGraph_t`). Null is rejected ([`Error::NullGraph`]).
    ///
    /// # Soundness
    /// The one place a handle Rust cannot vouch for becomes a [`GraphRef`]: sound only if
    /// `handle` is a live `CUgraph` that nothing destroys or changes until `f` returns. The
    /// foreign caller that owns the graph makes that promise (the driver cannot validate a
    /// handle; `unsafe` here would move the same promise into the binding, no nearer a
    /// check). Null is refused, and the borrow cannot outlive the call.
    pub fn with_raw_handle<R>(
        handle: u64,
        f: impl for<'g> FnOnce(GraphRef<'g>) -> R,
    ) -> Result<R, Error> {
        if handle == 0 {
            return Err(Error::NullGraph);
        }
        // SAFETY: non-null, and live and unchanged for the call, as the caller promises
        // (see above); the lifetime ends with the call.
        let graph = unsafe { GraphRef::from_raw(handle as usize as sys::CUgraph) };
        Ok(f(graph))
    }

    /// The graph's handle as an integer, as torch's `CUDAGraph.raw_cuda_graph()` gives one
    /// (what `graphcheck::cuda::retarget::apply_plan` takes).
    pub fn handle(self) -> u64 {
        self.raw() as u64
    }

    /// The raw handle, for the driver calls of [`crate::owned`].
    pub(crate) fn raw(self) -> sys::CUgraph {
        self.raw
    }

    /// The nodes, in the driver's order.
    pub fn nodes(self) -> Result<Vec<NodeRef<'a>>, DriverError> {
        let mut n = 0usize;
        // SAFETY: a null array asks for the count only.
        unsafe { raw::cuGraphGetNodes(self.raw, std::ptr::null_mut(), &mut n) }
            .check("cuGraphGetNodes")?;
        // An empty graph (torch only warns on an empty capture) has no nodes to fetch, and
        // asking for zero nodes into an array is CUDA_ERROR_INVALID_VALUE.
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut handles = vec![std::ptr::null_mut(); n];
        // SAFETY: `handles` has room for `n` handles; the driver writes at most `n`.
        unsafe { raw::cuGraphGetNodes(self.raw, handles.as_mut_ptr(), &mut n) }
            .check("cuGraphGetNodes")?;
        handles.truncate(n);
        Ok(handles.into_iter().map(NodeRef::new).collect())
    }
}

/// A node of a borrowed graph.
#[derive(Clone, Copy, Debug)]
pub struct NodeRef<'a> {
    raw: sys::CUgraphNode,
    _life: PhantomData<&'a ()>,
}

impl<'a> NodeRef<'a> {
    /// A node handle the driver handed out for a graph borrowed for `'a`.
    pub(crate) fn new(raw: sys::CUgraphNode) -> NodeRef<'a> {
        NodeRef {
            raw,
            _life: PhantomData,
        }
    }

    /// The raw handle, for the driver calls of [`crate::owned`].
    pub(crate) fn raw(self) -> sys::CUgraphNode {
        self.raw
    }
}

/// What a kernel node launches, and with what.
pub struct KernelNode<'a> {
    func: sys::CUfunction,
    kern: sys::CUkernel,
    /// Blocks per grid (x, y, z).
    pub grid: [u32; 3],
    /// Threads per block (x, y, z).
    pub block: [u32; 3],
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
    _life: PhantomData<&'a ()>,
}

/// A memset node's destination and the bytes it writes.
#[derive(Clone, Copy, Debug)]
pub struct MemsetNode {
    /// The first byte written.
    pub dst: u64,
    /// The bytes written: element size × width × height.
    pub bytes: u64,
}

/// How the driver addresses one end of a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryType {
    /// A host pointer (`CU_MEMORYTYPE_HOST`): pinned or registered host memory.
    Host,
    /// `CU_MEMORYTYPE_DEVICE`.
    Device,
    /// `CU_MEMORYTYPE_UNIFIED`: any address of the unified space, host or device.
    Unified,
}

/// One end of a copy: its first byte (with the 3D offsets applied) and how it is
/// addressed, or `None` for a CUDA array or an unknown memory type.
#[derive(Clone, Copy, Debug)]
pub struct MemcpyEnd {
    /// The address and how the driver addresses it.
    pub addr: Option<(u64, MemoryType)>,
    /// The `CUmemorytype` as the driver numbered it.
    pub memory_type: u32,
}

/// A memcpy node's two ends and the bytes it copies.
#[derive(Clone, Copy, Debug)]
pub struct MemcpyNode {
    /// Where the copy writes.
    pub dst: MemcpyEnd,
    /// Where it reads.
    pub src: MemcpyEnd,
    /// The bytes copied: width × height × depth.
    pub bytes: u64,
}

impl<'a> NodeRef<'a> {
    /// The node type as the driver numbers it.
    pub fn type_number(self) -> Result<u32, DriverError> {
        let mut t: u32 = u32::MAX;
        // SAFETY: CUgraphNodeType is a 4-byte C enum; the driver writes one value, which we
        // keep as an integer so that an unknown value is not an invalid Rust enum.
        unsafe { raw::cuGraphNodeGetType(self.raw, &mut t) }.check("cuGraphNodeGetType")?;
        Ok(t)
    }

    /// The launch of a kernel node.
    pub fn kernel(self) -> Result<KernelNode<'a>, DriverError> {
        // The struct holds only handles, integers and pointers (no enum field), so
        // all-zero is a valid value and the driver's writes keep it valid.
        let mut p = MaybeUninit::<sys::CUDA_KERNEL_NODE_PARAMS>::zeroed();
        // SAFETY: writes the struct; the pointers in it stay owned by the node.
        unsafe { raw::cuGraphKernelNodeGetParams_v2(self.raw, p.as_mut_ptr()) }
            .check("cuGraphKernelNodeGetParams")?;
        // SAFETY: zero-initialized and then written by the driver, field types all valid
        // for any bit pattern (see above).
        let p = unsafe { p.assume_init() };
        Ok(KernelNode {
            func: p.func,
            kern: p.kern,
            grid: [p.gridDimX, p.gridDimY, p.gridDimZ],
            block: [p.blockDimX, p.blockDimY, p.blockDimZ],
            kernel_params: p.kernelParams,
            extra: p.extra,
            _life: PhantomData,
        })
    }

    /// The destination and extent of a memset node.
    pub fn memset(self) -> Result<MemsetNode, DriverError> {
        // Integers only: all-zero is valid.
        let mut p = MaybeUninit::<sys::CUDA_MEMSET_NODE_PARAMS>::zeroed();
        // SAFETY: writes the struct.
        unsafe { raw::cuGraphMemsetNodeGetParams(self.raw, p.as_mut_ptr()) }
            .check("cuGraphMemsetNodeGetParams")?;
        // SAFETY: zero-initialized, then written by the driver; integer fields only.
        let p = unsafe { p.assume_init() };
        Ok(MemsetNode {
            dst: p.dst,
            bytes: (p.elementSize as u64)
                .saturating_mul(p.width as u64)
                .saturating_mul(p.height.max(1) as u64),
        })
    }

    /// The two ends of a memcpy node. `CUDA_MEMCPY3D` has two enum fields
    /// (`srcMemoryType`, `dstMemoryType`, Rust enums with no zero variant): the struct is
    /// never materialized as a Rust value; each field is read through a raw pointer, the
    /// enums as `u32`.
    pub fn memcpy(self) -> Result<MemcpyNode, DriverError> {
        // Zeroed bytes, never claimed to be a valid CUDA_MEMCPY3D; the driver writes them.
        let mut p = MaybeUninit::<sys::CUDA_MEMCPY3D>::zeroed();
        // SAFETY: writes the struct.
        unsafe { raw::cuGraphMemcpyNodeGetParams(self.raw, p.as_mut_ptr()) }
            .check("cuGraphMemcpyNodeGetParams")?;
        let p = p.as_ptr();
        // SAFETY: every read below is of a field of the (zeroed, then driver-written)
        // struct through `addr_of!`, as its integer or pointer type; the two enum fields
        // are read as the 4-byte integers they are in C (`#[repr(u32)]` in cudarc).
        let end = |memory_type: *const sys::CUmemorytype,
                   host: *const *const c_void,
                   device: *const u64,
                   x: *const usize,
                   y: *const usize,
                   z: *const usize,
                   pitch: *const usize,
                   height: *const usize| unsafe {
            let memory_type = memory_type.cast::<u32>().read();
            let (base, kind) = match memory_type {
                // CU_MEMORYTYPE_HOST: a host pointer (pinned or registered memory).
                1 => (host.read() as u64, MemoryType::Host),
                // CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_UNIFIED: a device-visible address.
                2 => (device.read(), MemoryType::Device),
                4 => (device.read(), MemoryType::Unified),
                // CU_MEMORYTYPE_ARRAY (3) and anything newer: no linear address.
                other => {
                    return MemcpyEnd {
                        addr: None,
                        memory_type: other,
                    };
                }
            };
            let (x, y, z, pitch, height) =
                (x.read(), y.read(), z.read(), pitch.read(), height.read());
            let offset = (x as u64)
                .wrapping_add((y as u64).wrapping_mul(pitch as u64))
                .wrapping_add(
                    (z as u64)
                        .wrapping_mul(pitch as u64)
                        .wrapping_mul(height as u64),
                );
            MemcpyEnd {
                addr: (base != 0).then(|| (base.wrapping_add(offset), kind)),
                memory_type,
            }
        };
        // SAFETY: field addresses of the struct above (no reads here).
        let (src, dst, bytes) = unsafe {
            let src = end(
                addr_of!((*p).srcMemoryType),
                addr_of!((*p).srcHost),
                addr_of!((*p).srcDevice),
                addr_of!((*p).srcXInBytes),
                addr_of!((*p).srcY),
                addr_of!((*p).srcZ),
                addr_of!((*p).srcPitch),
                addr_of!((*p).srcHeight),
            );
            let dst = end(
                addr_of!((*p).dstMemoryType),
                addr_of!((*p).dstHost).cast::<*const c_void>(),
                addr_of!((*p).dstDevice),
                addr_of!((*p).dstXInBytes),
                addr_of!((*p).dstY),
                addr_of!((*p).dstZ),
                addr_of!((*p).dstPitch),
                addr_of!((*p).dstHeight),
            );
            let bytes = (addr_of!((*p).WidthInBytes).read() as u64)
                .saturating_mul(addr_of!((*p).Height).read().max(1) as u64)
                .saturating_mul(addr_of!((*p).Depth).read().max(1) as u64);
            (src, dst, bytes)
        };
        Ok(MemcpyNode { dst, src, bytes })
    }

    /// What a graph memory-allocation node allocates: (address, bytes). The parameters
    /// hold `CUmemPoolProps`, whose fields are enums: read field by field, never as a
    /// Rust value.
    pub fn mem_alloc(self) -> Result<(u64, u64), DriverError> {
        let mut p = MaybeUninit::<sys::CUDA_MEM_ALLOC_NODE_PARAMS>::zeroed();
        // SAFETY: writes the struct (the access descriptors stay owned by the node).
        unsafe { raw::cuGraphMemAllocNodeGetParams(self.raw, p.as_mut_ptr()) }
            .check("cuGraphMemAllocNodeGetParams")?;
        let p = p.as_ptr();
        // SAFETY: integer fields of the driver-written struct, read through `addr_of!`.
        Ok(unsafe {
            (
                addr_of!((*p).dptr).read(),
                addr_of!((*p).bytesize).read() as u64,
            )
        })
    }

    /// The address a graph memory-free node frees.
    pub fn mem_free(self) -> Result<u64, DriverError> {
        let mut dptr: u64 = 0;
        // SAFETY: writes one address.
        unsafe { raw::cuGraphMemFreeNodeGetParams(self.raw, &mut dptr) }
            .check("cuGraphMemFreeNodeGetParams")?;
        Ok(dptr)
    }

    /// The body of a child-graph node, owned by the node.
    pub fn child_graph(self) -> Result<GraphRef<'a>, DriverError> {
        let mut g: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: writes one handle, owned by the node; we never destroy it.
        unsafe { raw::cuGraphChildGraphNodeGetGraph(self.raw, &mut g) }
            .check("cuGraphChildGraphNodeGetGraph")?;
        Ok(GraphRef {
            raw: g,
            _life: PhantomData,
        })
    }

    /// The bodies of a conditional node, owned by the node. Reading them takes
    /// `cuGraphNodeGetParams`, looked up at run time: the H200's driver 580 (CUDA 13.0)
    /// does not export it (checked with `nm -D` and `cuGetProcAddress`), and no other call
    /// returns the bodies, so there the node is listed as unread.
    pub fn conditional_bodies(self) -> Result<Vec<GraphRef<'a>>, DriverError> {
        // `CUgraphNodeParams` starts with an enum (`type_`) and its `conditional` member
        // holds another: never a Rust value, read field by field.
        let mut p = MaybeUninit::<sys::CUgraphNodeParams>::zeroed();
        // SAFETY: writes the struct, whose layout is the same in the 12.8 and 13 headers.
        let status = unsafe { raw::cuGraphNodeGetParams(self.raw, p.as_mut_ptr()) };
        if status == Status::NOT_EXPORTED {
            return Err(DriverError::new(
                "cuGraphNodeGetParams",
                0,
                "this driver does not export it (driver 580 / CUDA 13.0 does not), and no \
                 other driver call hands out a conditional node's bodies",
            ));
        }
        status.check("cuGraphNodeGetParams")?;
        let p = p.as_ptr();
        // SAFETY: the node is a conditional node (the caller checked its type), so the union
        // holds `conditional`, whose `phGraph_out` points to `size` graphs owned by the
        // node; both are read through `addr_of!` as their integer and pointer types.
        let bodies = unsafe {
            let c = addr_of!((*p).__bindgen_anon_1.conditional);
            let graphs = addr_of!((*c).phGraph_out).read();
            let size = addr_of!((*c).size).read();
            if graphs.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(graphs, size as usize).to_vec()
            }
        };
        Ok(bodies
            .into_iter()
            .map(|raw| GraphRef {
                raw,
                _life: PhantomData,
            })
            .collect())
    }
}

impl<'a> KernelNode<'a> {
    /// Identifies the launched function (function and library-kernel handles), so that
    /// its name and layout are read once per walk, not once per node.
    pub fn function_key(&self) -> (usize, usize) {
        (self.func as usize, self.kern as usize)
    }

    /// The address of the kernel's name string, owned by its module: equal for every
    /// launch of one kernel even where the function handles differ, so it keys caches.
    pub fn name_key(&self) -> Result<usize, Error> {
        Ok(self.name_ptr()? as usize)
    }

    fn name_ptr(&self) -> Result<*const std::ffi::c_char, Error> {
        let mut p: *const std::ffi::c_char = std::ptr::null();
        if !self.func.is_null() {
            // SAFETY: writes a pointer to a string owned by the module.
            unsafe { raw::cuFuncGetName(&mut p, self.func) }.check("cuFuncGetName")?;
        } else if !self.kern.is_null() {
            // SAFETY: as above, for a library kernel.
            unsafe { raw::cuKernelGetName(&mut p, self.kern) }.check("cuKernelGetName")?;
        } else {
            return Err(Error::NoFunction);
        }
        Ok(p)
    }

    /// The kernel's name as the driver has it (mangled for C++ kernels).
    pub fn raw_name(&self) -> Result<String, Error> {
        let p = self.name_ptr()?;
        if p.is_null() {
            return Ok(String::new());
        }
        // SAFETY: NUL-terminated, owned by the loaded module, alive while the node is.
        Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    /// The kernel's raw name's bytes (no NUL), borrowed from its loaded module; `None`
    /// where the driver gives no name.
    pub fn raw_name_bytes(&self) -> Option<&'a [u8]> {
        let p = self.name_ptr().ok()?;
        if p.is_null() {
            return None;
        }
        // SAFETY: NUL-terminated, owned by the loaded module, alive while the node is.
        Some(unsafe { CStr::from_ptr(p) }.to_bytes())
    }

    /// The parameter layout, (offset, size) per parameter, read by asking for parameter
    /// 0, 1, … until the driver says there is no such parameter (`CUDA_ERROR_INVALID_VALUE`).
    /// Any other answer to the first question is an error: the layout is unknown.
    pub fn param_layout(&self) -> Result<Vec<(usize, usize)>, DriverError> {
        let mut out = Vec::new();
        for i in 0..4096usize {
            let (mut off, mut size) = (0usize, 0usize);
            let status = if !self.func.is_null() {
                // SAFETY: writes two integers.
                unsafe { raw::cuFuncGetParamInfo(self.func, i, &mut off, &mut size) }
            } else if !self.kern.is_null() {
                // SAFETY: writes two integers.
                unsafe { raw::cuKernelGetParamInfo(self.kern, i, &mut off, &mut size) }
            } else {
                break;
            };
            if !status.is_success() {
                if i == 0 && status != Status::INVALID_VALUE {
                    return Err(DriverError::from_status("cuFuncGetParamInfo", status));
                }
                break;
            }
            out.push((off, size));
        }
        Ok(out)
    }

    /// Whether the parameters come one pointer per parameter (`kernelParams`).
    pub fn has_kernel_params(&self) -> bool {
        !self.kernel_params.is_null()
    }

    /// The bytes of parameter `i`, `size` long (from the layout), through `kernelParams`.
    /// Empty when the node has no `kernelParams` or `i` holds a null pointer.
    ///
    /// `i` and `size` must come from [`Self::param_layout`] of this node's function:
    /// `kernelParams` holds exactly one pointer per parameter.
    pub fn param(&self, i: usize, size: usize) -> &'a [u8] {
        if self.kernel_params.is_null() {
            return &[];
        }
        // SAFETY: `kernelParams` holds one pointer per parameter of the kernel and `i` is
        // one of them (see above); each points to `size` bytes owned by the node.
        unsafe {
            let p = *self.kernel_params.add(i);
            if p.is_null() {
                &[]
            } else {
                std::slice::from_raw_parts(p as *const u8, size)
            }
        }
    }

    /// The packed parameter buffer passed through `extra`, where the node has one.
    pub fn packed_params(&self) -> Option<&'a [u8]> {
        if self.extra.is_null() {
            return None;
        }
        // `extra` is (key, value) pairs ended by CU_LAUNCH_PARAM_END (0):
        // BUFFER_POINTER (1) → the packed buffer, BUFFER_SIZE (2) → its size.
        let (mut buf, mut size): (*const u8, Option<usize>) = (std::ptr::null(), None);
        let mut j = 0;
        loop {
            // SAFETY: the array is terminated by a null key (CU_LAUNCH_PARAM_END); we read
            // pairs until it, and bound the walk in case a driver breaks that.
            let key = unsafe { *self.extra.add(j) } as usize;
            if key == 0 || j > 64 {
                break;
            }
            // SAFETY: a non-END key is followed by its value.
            let val = unsafe { *self.extra.add(j + 1) };
            match key {
                1 => buf = val as *const u8,
                // SAFETY: BUFFER_SIZE's value points to a size_t.
                2 if !val.is_null() => size = Some(unsafe { *(val as *const usize) }),
                _ => {}
            }
            j += 2;
        }
        match (buf.is_null(), size) {
            // SAFETY: the driver keeps `size` bytes at `buf` for the node's lifetime.
            (false, Some(size)) => Some(unsafe { std::slice::from_raw_parts(buf, size) }),
            _ => None,
        }
    }
}

/// Whether this driver can hand out a conditional node's bodies (`cuGraphNodeGetParams`).
pub fn can_read_conditional_bodies() -> bool {
    raw::is_exported(b"cuGraphNodeGetParams\0")
}

/// Turns off cudarc's per-slice event tracking for `ctx`: it records events on other
/// streams, which invalidates a stream capture (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`).
/// A capturing program orders its accesses itself, as CUDA graphs require.
pub fn disable_event_tracking(ctx: &cudarc::driver::CudaContext) {
    // SAFETY: event tracking only orders accesses across streams; cudarc documents that
    // turning it off leaves that ordering to the caller, which a capture provides.
    unsafe { ctx.disable_event_tracking() }
}
