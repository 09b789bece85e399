//! Graphs and memory this process makes and destroys itself, as the GPU tests build them:
//! an [`OwnedGraph`] (destroyed on drop) captured from a stream or built node by node,
//! conditional bodies to capture into, replays; stream-ordered device allocations; zeroed
//! pinned host buffers; external event nodes and host-function nodes. Unlike the borrowed
//! handles of [`crate::graph`], everything here is ours to destroy.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::{addr_of, addr_of_mut};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::{
    CudaContext, CudaEvent, CudaStream, DeviceRepr, PinnedHostSlice, ValidAsZeroBits, result, sys,
};

use crate::raw;
use crate::{DriverError, Error, GraphRef, NodeRef};

/// A graph this process created, destroyed when dropped.
///
/// Nodes are only ever added (never changed or removed) through `&self`, so what was read
/// through [`Self::graph_ref`] before stays valid: adding a node does not touch the
/// parameters of the others.
#[derive(Debug)]
pub struct OwnedGraph {
    raw: sys::CUgraph,
}

impl Drop for OwnedGraph {
    fn drop(&mut self) {
        // SAFETY: created by this value, destroyed once; every borrow of it has ended.
        let _ = unsafe { result::graph::destroy(self.raw) };
    }
}

impl OwnedGraph {
    /// An empty graph (`cuGraphCreate`). Initializes the driver first; needs no context.
    pub fn new() -> Result<OwnedGraph, Error> {
        crate::init()?;
        let mut raw: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: writes one handle, destroyed by our drop.
        unsafe { raw::cuGraphCreate(&mut raw, 0) }.check("cuGraphCreate")?;
        Ok(OwnedGraph { raw })
    }

    /// Captures what `work` enqueues on `stream` (`cuStreamBeginCapture` in global mode, so
    /// that other streams can join by events), without instantiating it. The capture is
    /// ended whatever `work` returns, so that the stream is usable again.
    pub fn capture(
        stream: &CudaStream,
        work: impl FnOnce() -> Result<(), Error>,
    ) -> Result<OwnedGraph, Error> {
        let s = stream.cu_stream();
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        // SAFETY: `s` is a live stream (borrowed for the call); ended below.
        unsafe { result::stream::begin_capture(s, mode) }
            .map_err(|e| DriverError::from_cudarc("cuStreamBeginCapture", e))?;
        let worked = work();
        // SAFETY: ends the capture begun above on the same stream.
        let ended = unsafe { result::stream::end_capture(s) }
            .map_err(|e| DriverError::from_cudarc("cuStreamEndCapture", e));
        // An ended capture's graph is ours whatever `work` said: owned before returning.
        let graph = match ended {
            Ok(raw) if !raw.is_null() => Some(OwnedGraph { raw }),
            Ok(_) => None,
            Err(e) => {
                worked?;
                return Err(e.into());
            }
        };
        worked?;
        graph.ok_or_else(|| {
            DriverError::new("cuStreamEndCapture", 0, "the capture produced no graph").into()
        })
    }

    /// Borrows the graph for reading.
    pub fn graph_ref(&self) -> GraphRef<'_> {
        // SAFETY: the graph lives as long as `self`, and `&self` only ever adds nodes
        // (see the type's documentation), which leaves what readers hold valid.
        unsafe { GraphRef::from_raw(self.raw) }
    }

    /// Adds a child-graph node that runs a copy of `child`, after `deps`.
    pub fn add_child_graph(
        &self,
        deps: &[NodeRef<'_>],
        child: GraphRef<'_>,
    ) -> Result<NodeRef<'_>, DriverError> {
        let deps: Vec<sys::CUgraphNode> = deps.iter().map(|n| n.raw()).collect();
        let mut node: sys::CUgraphNode = std::ptr::null_mut();
        // SAFETY: our live graph, `deps.len()` node handles of live graphs, a live child
        // graph (the driver copies it); writes one node handle owned by our graph.
        unsafe {
            raw::cuGraphAddChildGraphNode(
                &mut node,
                self.raw,
                deps.as_ptr(),
                deps.len(),
                child.raw(),
            )
        }
        .check("cuGraphAddChildGraphNode")?;
        Ok(NodeRef::new(node))
    }

    /// Adds an empty node after `deps`.
    pub fn add_empty_node(&self, deps: &[NodeRef<'_>]) -> Result<NodeRef<'_>, DriverError> {
        let deps: Vec<sys::CUgraphNode> = deps.iter().map(|n| n.raw()).collect();
        let mut node: sys::CUgraphNode = std::ptr::null_mut();
        // SAFETY: as in `add_child_graph`.
        unsafe { raw::cuGraphAddEmptyNode(&mut node, self.raw, deps.as_ptr(), deps.len()) }
            .check("cuGraphAddEmptyNode")?;
        Ok(NodeRef::new(node))
    }

    /// Adds a conditional IF node with no dependencies whose condition is set to 1 at every
    /// launch (so its body runs), in `ctx`; returns its (empty) body to capture into.
    pub fn add_if_node(&self, ctx: &CudaContext) -> Result<ConditionalBody<'_>, DriverError> {
        let mut handle: sys::CUgraphConditionalHandle = 0;
        // SAFETY: a handle of our live graph in a live context; writes one integer.
        unsafe {
            raw::cuGraphConditionalHandleCreate(
                &mut handle,
                self.raw,
                ctx.cu_ctx(),
                1,
                sys::CU_GRAPH_COND_ASSIGN_DEFAULT,
            )
        }
        .check("cuGraphConditionalHandleCreate")?;
        // The node's parameters hold enums: built in place, field by field, never as a
        // zeroed Rust value.
        let mut p = MaybeUninit::<sys::CUgraphNodeParams>::zeroed();
        let mut node: sys::CUgraphNode = std::ptr::null_mut();
        let pp = p.as_mut_ptr();
        // SAFETY: zeroed bytes, then every field the call reads written with valid values
        // through raw pointers; the driver writes the body graph's handle (owned by the
        // node) into `phGraph_out`, read back as the pointer it is.
        let body = unsafe {
            addr_of_mut!((*pp).type_).write(sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL);
            let c = addr_of_mut!((*pp).__bindgen_anon_1.conditional);
            addr_of_mut!((*c).handle).write(handle);
            addr_of_mut!((*c).type_).write(sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF);
            addr_of_mut!((*c).size).write(1);
            addr_of_mut!((*c).ctx).write(ctx.cu_ctx());
            raw::cuGraphAddNode(&mut node, self.raw, std::ptr::null(), 0, pp)
                .check("cuGraphAddNode")?;
            let graphs = addr_of!((*c).phGraph_out).read();
            if graphs.is_null() {
                std::ptr::null_mut()
            } else {
                graphs.read()
            }
        };
        if body.is_null() {
            return Err(DriverError::new(
                "cuGraphAddNode",
                0,
                "the conditional node came back without a body graph",
            ));
        }
        Ok(ConditionalBody {
            raw: body,
            _graph: PhantomData,
        })
    }

    /// Instantiates the graph, launches it `times` times on `stream`, waits for the stream
    /// and destroys the instance.
    pub fn replay(&self, stream: &CudaStream, times: usize) -> Result<(), DriverError> {
        stream.context().bind_to_thread()?;
        // SAFETY: our live graph; the instance is destroyed below.
        let exec =
            unsafe { result::graph::instantiate(self.raw, sys::CUgraphInstantiate_flags(0)) }
                .map_err(|e| DriverError::from_cudarc("cuGraphInstantiateWithFlags", e))?;
        let mut ran = Ok(());
        for _ in 0..times {
            // SAFETY: a live instance and a live stream.
            ran = unsafe { result::graph::launch(exec, stream.cu_stream()) }
                .map_err(|e| DriverError::from_cudarc("cuGraphLaunch", e));
            if ran.is_err() {
                break;
            }
        }
        let synced = stream
            .synchronize()
            .map_err(|e| DriverError::from_cudarc("cuStreamSynchronize", e));
        // SAFETY: instantiated above, no launch of it in flight after the synchronization
        // (or, if that failed, the driver defers the destruction until its launches end).
        let _ = unsafe { result::graph::exec_destroy(exec) };
        ran.and(synced)
    }
}

/// The body of a conditional node of an [`OwnedGraph`], owned by the node.
#[derive(Debug)]
pub struct ConditionalBody<'g> {
    raw: sys::CUgraph,
    _graph: PhantomData<&'g OwnedGraph>,
}

impl ConditionalBody<'_> {
    /// Captures what `work` enqueues on `stream` into the body
    /// (`cuStreamBeginCaptureToGraph`, global mode). The capture is ended whatever `work`
    /// returns.
    pub fn capture(
        &self,
        stream: &CudaStream,
        work: impl FnOnce() -> Result<(), Error>,
    ) -> Result<(), Error> {
        let s = stream.cu_stream();
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        // SAFETY: a live stream and the live body graph (owned by a node of the borrowed
        // graph); no dependency arrays. Ended below.
        unsafe {
            raw::cuStreamBeginCaptureToGraph(
                s,
                self.raw,
                std::ptr::null(),
                std::ptr::null(),
                0,
                mode,
            )
        }
        .check("cuStreamBeginCaptureToGraph")?;
        let worked = work();
        // SAFETY: ends the capture begun above; the graph it returns is the body, which the
        // node owns (not destroyed here).
        let ended = unsafe { result::stream::end_capture(s) }
            .map_err(|e| DriverError::from_cudarc("cuStreamEndCapture", e));
        worked?;
        ended?;
        Ok(())
    }

    /// Borrows the body for reading.
    pub fn graph_ref(&self) -> GraphRef<'_> {
        // SAFETY: the node owns the body for as long as the owning graph lives, which
        // outlives `self`; nothing here but `capture` changes it, and only by adding nodes.
        unsafe { GraphRef::from_raw(self.raw) }
    }
}

/// Stream-ordered device memory (`cuMemAllocAsync`): in a capture, a graph
/// memory-allocation node; [`Self::free`] is then a memory-free node.
#[derive(Debug)]
#[must_use = "freed only by `free`"]
pub struct StreamAllocation {
    ptr: sys::CUdeviceptr,
}

impl StreamAllocation {
    /// Allocates `bytes` on `stream`.
    pub fn new(stream: &CudaStream, bytes: usize) -> Result<StreamAllocation, DriverError> {
        // SAFETY: a live stream; the memory is device memory that no Rust value aliases,
        // freed by `free` (or never).
        let ptr = unsafe { result::malloc_async(stream.cu_stream(), bytes) }
            .map_err(|e| DriverError::from_cudarc("cuMemAllocAsync", e))?;
        Ok(StreamAllocation { ptr })
    }

    /// The device address.
    pub fn addr(&self) -> u64 {
        self.ptr
    }

    /// Frees the memory on `stream` (`cuMemFreeAsync`).
    pub fn free(self, stream: &CudaStream) -> Result<(), DriverError> {
        // SAFETY: allocated by `new`, freed once (this consumes it), on a live stream.
        unsafe { result::free_async(self.ptr, stream.cu_stream()) }
            .map_err(|e| DriverError::from_cudarc("cuMemFreeAsync", e))
    }
}

/// Page-locked host memory of `len` zeroed values (`cuMemHostAlloc`, no flags: the memory
/// `cuMemAllocHost` gives), freed when dropped. cudarc's allocation is unsafe only because
/// it leaves the memory unset; zeroed, it holds valid values.
pub fn pinned_zeroed<T: DeviceRepr + ValidAsZeroBits>(
    ctx: &Arc<CudaContext>,
    len: usize,
) -> Result<PinnedHostSlice<T>, DriverError> {
    // SAFETY: the memory is zeroed below, before anything reads it.
    let mut host = unsafe { ctx.alloc_pinned_with_flags::<T>(len, 0) }
        .map_err(|e| DriverError::from_cudarc("cuMemHostAlloc", e))?;
    let p = host.as_mut_ptr()?;
    // SAFETY: `len` values of our own allocation, no copy in flight (just made); all-zero
    // is a valid `T` (`ValidAsZeroBits`).
    unsafe { std::ptr::write_bytes(p, 0, len) };
    Ok(host)
}

/// Records `event` on `stream` as an external event (`CU_EVENT_RECORD_EXTERNAL`): in a
/// capture, an event-record node.
pub fn record_external(event: &CudaEvent, stream: &CudaStream) -> Result<(), DriverError> {
    // SAFETY: a live event and a live stream, both borrowed for the call.
    unsafe {
        raw::cuEventRecordWithFlags(
            event.cu_event(),
            stream.cu_stream(),
            sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32,
        )
    }
    .check("cuEventRecordWithFlags")
}

/// Makes `stream` wait for `event` as an external event (`CU_EVENT_WAIT_EXTERNAL`): in a
/// capture, a wait-event node instead of an edge.
pub fn wait_external(stream: &CudaStream, event: &CudaEvent) -> Result<(), DriverError> {
    // SAFETY: a live stream and a live event, both borrowed for the call.
    unsafe {
        result::stream::wait_event(
            stream.cu_stream(),
            event.cu_event(),
            sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL,
        )
    }
    .map_err(|e| DriverError::from_cudarc("cuStreamWaitEvent", e))
}

/// Enqueues a host function that adds 1 to `counter` (`cuLaunchHostFunc`): in a capture, a
/// host node.
pub fn launch_host_counter(
    stream: &CudaStream,
    counter: &'static AtomicUsize,
) -> Result<(), DriverError> {
    extern "C" fn bump(counter: *mut c_void) {
        // SAFETY: the pointer is the `&'static AtomicUsize` passed below; it never dangles,
        // and atomics may be shared with the driver's callback thread.
        unsafe { &*(counter as *const AtomicUsize) }.fetch_add(1, Ordering::SeqCst);
    }
    // SAFETY: a live stream; the function makes no driver call and its argument lives
    // forever.
    unsafe {
        result::stream::launch_host_function(
            stream.cu_stream(),
            bump,
            counter as *const AtomicUsize as *mut c_void,
        )
    }
    .map_err(|e| DriverError::from_cudarc("cuLaunchHostFunc", e))
}
