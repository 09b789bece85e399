//! Patching a captured graph in place (retarget): a kernel node's parameter bytes, a
//! memset node's destination, a memcpy node's ends, set on the template graph (so a later
//! walk reads them) and on the executable graph instantiated from it (so the next replay
//! runs them), through [`GraphMut`].
//!
//! Reading hands out only owned copies ([`KernelArgs`]): a set call frees the parameter
//! buffers a [`crate::KernelNode`] borrows, so a borrowed read ([`GraphMut::read`]) holds
//! `&self` and every write needs `&mut self`: no borrowed slice outlives a write. Nodes are
//! named by [`NodeId`], an owned copy of the handle.
//!
//! Driver-written structs are read through `MaybeUninit`; `CUDA_MEMCPY3D`, whose memory
//! types are enums, is never materialized: its fields are read and written through raw
//! pointers, the enums as integers.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::{addr_of, addr_of_mut};

use cudarc::driver::{result, sys};

use crate::graph::{GraphRef, NodeRef};
use crate::raw;
use crate::{DriverError, Error};

/// A node of a graph, by its handle, owned (no borrow of the graph): what [`GraphMut`]'s
/// writes take. Made only from a [`NodeRef`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NodeId(usize);

impl NodeRef<'_> {
    /// The node's handle as an owned id, for [`GraphMut`]'s calls.
    pub fn id(self) -> NodeId {
        NodeId(self.raw() as usize)
    }
}

/// A kernel node's parameter bytes, copied out of the node: one buffer per parameter
/// (`kernelParams`), or the one packed buffer passed through `extra` (cuBLAS's nvjet
/// GEMMs), with the function's layout ((offset, size) per parameter).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelArgs {
    /// (offset, size) per parameter, from `cuFuncGetParamInfo`.
    pub layout: Vec<(usize, usize)>,
    /// The bytes.
    pub bytes: ArgBytes,
}

/// Where a kernel node's parameter bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgBytes {
    /// One buffer per parameter, each of the layout's size.
    PerParam(Vec<Vec<u8>>),
    /// One buffer holding every parameter at its layout offset.
    Packed(Vec<u8>),
}

/// Bytes at an address aligned to 16 (the largest alignment of a kernel parameter the
/// driver copies from), held for one set call.
struct Aligned {
    v: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    fn of(bytes: &[u8]) -> Aligned {
        let mut v = vec![0u8; bytes.len() + 16];
        let start = v.as_ptr().align_offset(16).min(16);
        v[start..start + bytes.len()].copy_from_slice(bytes);
        Aligned {
            v,
            start,
            len: bytes.len(),
        }
    }

    fn ptr(&mut self) -> *mut c_void {
        self.v[self.start..self.start + self.len]
            .as_mut_ptr()
            .cast::<c_void>()
    }
}

/// A graph being patched: the template (`CUgraph`) and, where the caller has it, the
/// executable graph (`CUgraphExec`) instantiated from it. Without the executable graph,
/// only the template changes: the caller instantiates again (or updates its executable
/// graph from the template) before the next replay.
pub struct GraphMut<'a> {
    graph: sys::CUgraph,
    exec: Option<sys::CUgraphExec>,
    /// Each kernel node's parameter layout, read once: a write changes a node's
    /// parameter bytes, never its function (a word's read, write and read back each
    /// asked the driver for every parameter's offset and size again).
    layouts: RefCell<HashMap<NodeId, Vec<(usize, usize)>>>,
    _life: PhantomData<&'a mut ()>,
}

/// `CU_LAUNCH_PARAM_BUFFER_POINTER`, `CU_LAUNCH_PARAM_BUFFER_SIZE`, `CU_LAUNCH_PARAM_END`.
const BUFFER_POINTER: usize = 1;
const BUFFER_SIZE: usize = 2;
const PARAM_END: usize = 0;

impl<'a> GraphMut<'a> {
    /// Lends the graph behind raw handle integers to `f`, for the call only: the template
    /// (`torch.cuda.CUDAGraph(keep_graph=True).raw_cuda_graph()`) and, optionally, the
    /// executable graph instantiated from it (`raw_cuda_graph_exec()`). Null is refused
    /// ([`Error::NullGraph`]).
    ///
    /// # Soundness
    /// As [`GraphRef::with_raw_handle`]: sound only if `graph` is a live `CUgraph`, and
    /// `exec` a live `CUgraphExec` instantiated from it, that nothing else reads, changes,
    /// replays or destroys until `f` returns (the driver synchronizes neither). The foreign
    /// caller that owns them makes that promise; the borrow cannot outlive the call.
    pub fn with_raw_handles<R>(
        graph: u64,
        exec: Option<u64>,
        f: impl for<'g> FnOnce(GraphMut<'g>) -> R,
    ) -> Result<R, Error> {
        if graph == 0 || exec == Some(0) {
            return Err(Error::NullGraph);
        }
        Ok(f(GraphMut {
            graph: graph as usize as sys::CUgraph,
            exec: exec.map(|e| e as usize as sys::CUgraphExec),
            layouts: RefCell::default(),
            _life: PhantomData,
        }))
    }

    /// Whether writes reach an executable graph too (not only the template).
    pub fn has_exec(&self) -> bool {
        self.exec.is_some()
    }

    /// The template, to read (walk, list nodes) between writes.
    pub fn read(&self) -> GraphRef<'_> {
        // SAFETY: live and not changed by others for `'a` (see `with_raw_handles`); this
        // borrow of `self` ends before any write (`&mut self`).
        unsafe { GraphRef::from_raw(self.graph) }
    }

    /// The node `id` names, to read (its type, a memset's or memcpy's parameters).
    pub fn node(&self, id: NodeId) -> NodeRef<'_> {
        NodeRef::new(id.0 as sys::CUgraphNode)
    }

    /// A kernel node's parameter bytes, copied, with the function's layout, read where the
    /// walker reads them: `kernelParams` where the node has it, else the packed buffer.
    pub fn kernel_args(&self, id: NodeId) -> Result<KernelArgs, DriverError> {
        let k = self.node(id).kernel()?;
        let known = self.layouts.borrow().get(&id).cloned();
        let layout = match known {
            Some(l) => l,
            None => {
                let l = k.param_layout()?;
                self.layouts.borrow_mut().insert(id, l.clone());
                l
            }
        };
        let bytes = if k.has_kernel_params() {
            ArgBytes::PerParam(
                layout
                    .iter()
                    .enumerate()
                    .map(|(i, &(_, size))| k.param(i, size).to_vec())
                    .collect(),
            )
        } else if let Some(buf) = k.packed_params() {
            ArgBytes::Packed(buf.to_vec())
        } else {
            return Err(DriverError::new(
                "cuGraphKernelNodeGetParams",
                0,
                "the node holds neither kernelParams nor a packed buffer",
            ));
        };
        Ok(KernelArgs { layout, bytes })
    }

    /// Sets a kernel node's parameter bytes (the launch otherwise as it is): on the
    /// template, then on the executable graph; where the executable graph refuses, the
    /// template gets its old bytes back.
    pub fn set_kernel_args(&mut self, id: NodeId, args: &KernelArgs) -> Result<(), DriverError> {
        let old = self.kernel_args(id)?;
        self.put_kernel_args(id, args, false)?;
        if self.exec.is_some()
            && let Err(e) = self.put_kernel_args(id, args, true)
        {
            let _ = self.put_kernel_args(id, &old, false);
            return Err(e);
        }
        Ok(())
    }

    /// One set call: on the executable graph (`exec`) or the template.
    fn put_kernel_args(
        &mut self,
        id: NodeId,
        args: &KernelArgs,
        exec: bool,
    ) -> Result<(), DriverError> {
        let node = id.0 as sys::CUgraphNode;
        // Handles, integers and pointers only: all-zero is valid, as in `NodeRef::kernel`.
        let mut p = MaybeUninit::<sys::CUDA_KERNEL_NODE_PARAMS>::zeroed();
        // SAFETY: writes the struct; the pointers in it stay owned by the node.
        unsafe { raw::cuGraphKernelNodeGetParams_v2(node, p.as_mut_ptr()) }
            .check("cuGraphKernelNodeGetParams")?;
        // SAFETY: zero-initialized, then written by the driver; no enum field.
        let mut p = unsafe { p.assume_init() };
        // The buffers the set call copies from, alive until it returns.
        let mut bufs: Vec<Aligned>;
        let mut ptrs: Vec<*mut c_void>;
        let mut size: usize;
        let mut extra: [*mut c_void; 5];
        match &args.bytes {
            ArgBytes::PerParam(params) => {
                if params.len() != args.layout.len()
                    || params.iter().zip(&args.layout).any(|(b, l)| b.len() != l.1)
                {
                    return Err(DriverError::new(
                        "cuGraphKernelNodeSetParams",
                        0,
                        "the parameter buffers do not match the kernel's layout",
                    ));
                }
                bufs = params.iter().map(|b| Aligned::of(b)).collect();
                ptrs = bufs.iter_mut().map(Aligned::ptr).collect();
                p.kernelParams = if ptrs.is_empty() {
                    std::ptr::null_mut()
                } else {
                    ptrs.as_mut_ptr()
                };
                p.extra = std::ptr::null_mut();
            }
            ArgBytes::Packed(buf) => {
                bufs = vec![Aligned::of(buf)];
                size = buf.len();
                extra = [
                    BUFFER_POINTER as *mut c_void,
                    bufs[0].ptr(),
                    BUFFER_SIZE as *mut c_void,
                    (&mut size as *mut usize).cast::<c_void>(),
                    PARAM_END as *mut c_void,
                ];
                p.kernelParams = std::ptr::null_mut();
                p.extra = extra.as_mut_ptr();
            }
        }
        let status = if exec {
            let Some(e) = self.exec else { return Ok(()) };
            // SAFETY: `p` is the node's launch as the driver gave it, its parameters
            // pointing to `bufs` (one buffer of the layout's size per parameter, or one
            // packed buffer and its size in `extra`), all alive until the call returns;
            // the driver copies them. The node is the template's, `e` instantiated from it.
            unsafe { raw::cuGraphExecKernelNodeSetParams_v2(e, node, &p) }
        } else {
            // SAFETY: as above, on the template's node.
            unsafe { raw::cuGraphKernelNodeSetParams_v2(node, &p) }
        };
        drop(bufs);
        status.check(if exec {
            "cuGraphExecKernelNodeSetParams"
        } else {
            "cuGraphKernelNodeSetParams"
        })
    }

    /// Sets a memset node's destination: on the template, then on the executable graph
    /// (the template restored where that fails).
    pub fn set_memset_dst(&mut self, id: NodeId, dst: u64) -> Result<(), DriverError> {
        let node = id.0 as sys::CUgraphNode;
        // Integers only: all-zero is valid.
        let mut p = MaybeUninit::<sys::CUDA_MEMSET_NODE_PARAMS>::zeroed();
        // SAFETY: writes the struct.
        unsafe { raw::cuGraphMemsetNodeGetParams(node, p.as_mut_ptr()) }
            .check("cuGraphMemsetNodeGetParams")?;
        // SAFETY: zero-initialized, then written by the driver; integer fields only.
        let old = unsafe { p.assume_init() };
        let mut new = old;
        new.dst = dst;
        // SAFETY: the node's own parameters with another destination.
        unsafe { raw::cuGraphMemsetNodeSetParams(node, &new) }
            .check("cuGraphMemsetNodeSetParams")?;
        if let Some(e) = self.exec {
            let ctx = current_context()?;
            // SAFETY: as above, on the executable graph instantiated from the template,
            // in the current context (the one the node's memory belongs to).
            let status = unsafe { raw::cuGraphExecMemsetNodeSetParams(e, node, &new, ctx) };
            if let Err(err) = status.check("cuGraphExecMemsetNodeSetParams") {
                // SAFETY: the parameters the node had.
                let _ = unsafe { raw::cuGraphMemsetNodeSetParams(node, &old) };
                return Err(err);
            }
        }
        Ok(())
    }

    /// Sets one end of a memcpy node (`end` 0: the destination, 1: the source, as the
    /// walker numbers them) so that its first byte is `addr`, the 3D offsets kept: on the
    /// template, then on the executable graph (the template restored where that fails).
    pub fn set_memcpy_end(&mut self, id: NodeId, end: u32, addr: u64) -> Result<(), DriverError> {
        let node = id.0 as sys::CUgraphNode;
        let current = self.node(id).memcpy()?;
        let (cur, _) = match end {
            0 => current.dst.addr,
            1 => current.src.addr,
            _ => None,
        }
        .ok_or_else(|| {
            DriverError::new(
                "cuGraphMemcpyNodeSetParams",
                0,
                "that end of the copy holds no linear address",
            )
        })?;
        // Zeroed bytes, never claimed to be a valid CUDA_MEMCPY3D (two enum fields).
        let mut p = MaybeUninit::<sys::CUDA_MEMCPY3D>::zeroed();
        // SAFETY: writes the struct.
        unsafe { raw::cuGraphMemcpyNodeGetParams(node, p.as_mut_ptr()) }
            .check("cuGraphMemcpyNodeGetParams")?;
        let old = p;
        let q = p.as_mut_ptr();
        // SAFETY: fields of the zeroed, driver-written struct, through `addr_of!` and
        // `addr_of_mut!` as their integer and pointer types; the memory types are read as
        // the 4-byte integers they are in C.
        unsafe {
            let (kind, host, device) = if end == 0 {
                (
                    addr_of!((*q).dstMemoryType).cast::<u32>().read(),
                    addr_of_mut!((*q).dstHost).cast::<u64>(),
                    addr_of_mut!((*q).dstDevice),
                )
            } else {
                (
                    addr_of!((*q).srcMemoryType).cast::<u32>().read(),
                    addr_of_mut!((*q).srcHost).cast::<u64>(),
                    addr_of_mut!((*q).srcDevice),
                )
            };
            // The base moves by what the first byte moves: the offsets stay.
            let field = if kind == 1 { host } else { device };
            field.write(field.read().wrapping_add(addr.wrapping_sub(cur)));
        }
        // SAFETY: the node's own parameters with one end moved.
        unsafe { raw::cuGraphMemcpyNodeSetParams(node, p.as_ptr()) }
            .check("cuGraphMemcpyNodeSetParams")?;
        if let Some(e) = self.exec {
            let ctx = current_context()?;
            // SAFETY: as above, on the executable graph instantiated from the template.
            let status = unsafe { raw::cuGraphExecMemcpyNodeSetParams(e, node, p.as_ptr(), ctx) };
            if let Err(err) = status.check("cuGraphExecMemcpyNodeSetParams") {
                // SAFETY: the parameters the node had.
                let _ = unsafe { raw::cuGraphMemcpyNodeSetParams(node, old.as_ptr()) };
                return Err(err);
            }
        }
        Ok(())
    }
}

/// The calling thread's current context (an executable graph's memset and memcpy updates
/// name one).
fn current_context() -> Result<sys::CUcontext, DriverError> {
    match result::ctx::get_current().map_err(|e| DriverError::from_cudarc("cuCtxGetCurrent", e))? {
        Some(c) if !c.is_null() => Ok(c),
        _ => Err(DriverError::new(
            "cuCtxGetCurrent",
            0,
            "no current CUDA context on this thread",
        )),
    }
}
