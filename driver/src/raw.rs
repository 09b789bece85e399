//! Driver calls that cudarc's `result` layer does not wrap, declared with the C `int`
//! result they have (a [`Status`]) instead of cudarc's `CUresult` enum, and looked up by name
//! in the library cudarc loaded. A code that no enum variant lists (a newer driver's) is
//! then just a number; and a call this driver does not export is
//! [`Status::NOT_EXPORTED`], where cudarc's `sys` would panic.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::OnceLock;

use cudarc::driver::sys;

use crate::DriverError;

/// A `CUresult` as the integer the driver returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(crate) struct Status(u32);

impl Status {
    pub(crate) const SUCCESS: Status = Status(0);
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub(crate) const INVALID_VALUE: Status = Status(1);
    /// `CUDA_ERROR_NOT_FOUND`: what `cuGetProcAddress` answers for a symbol it lacks.
    pub(crate) const NOT_FOUND: Status = Status(500);
    /// Not a driver code: the call is not exported by this driver (or there is no driver).
    pub(crate) const NOT_EXPORTED: Status = Status(u32::MAX);

    pub(crate) fn code(self) -> u32 {
        self.0
    }

    pub(crate) fn is_success(self) -> bool {
        self == Status::SUCCESS
    }

    /// `Ok` on success, else the error naming `call`.
    pub(crate) fn check(self, call: &'static str) -> Result<(), DriverError> {
        if self.is_success() {
            Ok(())
        } else {
            Err(DriverError::from_status(call, self))
        }
    }
}

/// Whether a driver library can be loaded (cudarc's loader panics where none can).
pub(crate) fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only probes for the library with dlopen.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// The driver's symbol `name` (NUL-terminated) as a function of type `F`, where the driver
/// exports it.
///
/// # Safety
/// `F` must be the symbol's C signature.
unsafe fn symbol<F: Copy>(name: &[u8]) -> Option<F> {
    if !driver_present() {
        return None;
    }
    // SAFETY: the library is present, so `culib` loads it instead of panicking; loading the
    // driver runs no initializer beyond what it runs for cudarc. The caller vouches for `F`.
    unsafe { sys::culib().get::<F>(name).ok().map(|s| *s) }
}

/// Whether the driver exports `name` (NUL-terminated).
pub(crate) fn is_exported(name: &[u8]) -> bool {
    // SAFETY: the symbol is only looked up, never called, so its type does not matter.
    unsafe { symbol::<unsafe extern "C" fn()>(name) }.is_some()
}

/// Declares driver calls with their `cuda.h` signatures and an integer result: each is an
/// `unsafe fn` returning [`Status`], looked up once.
macro_rules! calls {
    ($( $(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?); )*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// As the call's contract in `cuda.h`: handles valid, pointers valid for what the
        /// call reads and writes.
        #[allow(non_snake_case)]
        pub(crate) unsafe fn $name($($arg: $ty),*) -> Status {
            type F = unsafe extern "C" fn($($ty),*) -> u32;
            static SYMBOL: OnceLock<Option<F>> = OnceLock::new();
            // SAFETY: `F` is the call's C signature (`cuda.h`, as cudarc's `sys` has it,
            // with the `CUresult` as the `int` it is).
            let f = SYMBOL.get_or_init(|| unsafe {
                symbol::<F>(concat!(stringify!($name), "\0").as_bytes())
            });
            match *f {
                // SAFETY: the caller upholds the call's contract.
                Some(f) => Status(unsafe { f($($arg),*) }),
                None => Status::NOT_EXPORTED,
            }
        }
    )*};
}

calls! {
    /// `cuGetErrorName`, taking the code as an integer.
    fn cuGetErrorName(error: u32, p_str: *mut *const c_char);
    /// `cuDriverGetVersion`.
    fn cuDriverGetVersion(version: *mut c_int);

    // Reading graphs.
    /// `cuGraphGetNodes`.
    fn cuGraphGetNodes(graph: sys::CUgraph, nodes: *mut sys::CUgraphNode, count: *mut usize);
    /// `cuGraphNodeGetType`, the type written as the 4-byte integer it is.
    fn cuGraphNodeGetType(node: sys::CUgraphNode, type_: *mut u32);
    /// `cuGraphKernelNodeGetParams_v2`.
    fn cuGraphKernelNodeGetParams_v2(node: sys::CUgraphNode, params: *mut sys::CUDA_KERNEL_NODE_PARAMS);
    /// `cuGraphMemsetNodeGetParams`.
    fn cuGraphMemsetNodeGetParams(node: sys::CUgraphNode, params: *mut sys::CUDA_MEMSET_NODE_PARAMS);
    /// `cuGraphMemcpyNodeGetParams`.
    fn cuGraphMemcpyNodeGetParams(node: sys::CUgraphNode, params: *mut sys::CUDA_MEMCPY3D);
    /// `cuGraphMemAllocNodeGetParams`.
    fn cuGraphMemAllocNodeGetParams(node: sys::CUgraphNode, params: *mut sys::CUDA_MEM_ALLOC_NODE_PARAMS);
    /// `cuGraphMemFreeNodeGetParams`.
    fn cuGraphMemFreeNodeGetParams(node: sys::CUgraphNode, dptr: *mut sys::CUdeviceptr);
    /// `cuGraphChildGraphNodeGetGraph`.
    fn cuGraphChildGraphNodeGetGraph(node: sys::CUgraphNode, graph: *mut sys::CUgraph);
    /// `cuGraphNodeGetParams` (conditional-node bodies). Driver 580 (CUDA 13.0) does not
    /// export it.
    fn cuGraphNodeGetParams(node: sys::CUgraphNode, params: *mut sys::CUgraphNodeParams);
    /// `cuFuncGetName`.
    fn cuFuncGetName(name: *mut *const c_char, func: sys::CUfunction);
    /// `cuKernelGetName`.
    fn cuKernelGetName(name: *mut *const c_char, kernel: sys::CUkernel);
    /// `cuFuncGetParamInfo`.
    fn cuFuncGetParamInfo(func: sys::CUfunction, index: usize, offset: *mut usize, size: *mut usize);
    /// `cuKernelGetParamInfo`.
    fn cuKernelGetParamInfo(kernel: sys::CUkernel, index: usize, offset: *mut usize, size: *mut usize);
    /// `cuStreamGetCaptureInfo_v2`, the status written as the 4-byte integer it is.
    fn cuStreamGetCaptureInfo_v2(
        stream: sys::CUstream,
        status: *mut u32,
        id: *mut c_ulonglong,
        graph: *mut sys::CUgraph,
        dependencies: *mut *const sys::CUgraphNode,
        count: *mut usize,
    );
    /// `cuMemGetAddressRange_v2`.
    fn cuMemGetAddressRange_v2(base: *mut sys::CUdeviceptr, size: *mut usize, dptr: sys::CUdeviceptr);
    /// `cuPointerGetAttribute`.
    fn cuPointerGetAttribute(data: *mut c_void, attribute: sys::CUpointer_attribute, ptr: sys::CUdeviceptr);
    /// `cuPointerGetAttributes`, the attributes passed as the 4-byte integers they are.
    fn cuPointerGetAttributes(count: c_uint, attributes: *const u32, data: *mut *mut c_void, ptr: sys::CUdeviceptr);

    // Patching graphs (retarget): the template's nodes and the executable graph's.
    /// `cuGraphKernelNodeSetParams_v2`.
    fn cuGraphKernelNodeSetParams_v2(node: sys::CUgraphNode, params: *const sys::CUDA_KERNEL_NODE_PARAMS);
    /// `cuGraphExecKernelNodeSetParams_v2`.
    fn cuGraphExecKernelNodeSetParams_v2(exec: sys::CUgraphExec, node: sys::CUgraphNode, params: *const sys::CUDA_KERNEL_NODE_PARAMS);
    /// `cuGraphMemsetNodeSetParams`.
    fn cuGraphMemsetNodeSetParams(node: sys::CUgraphNode, params: *const sys::CUDA_MEMSET_NODE_PARAMS);
    /// `cuGraphExecMemsetNodeSetParams`.
    fn cuGraphExecMemsetNodeSetParams(exec: sys::CUgraphExec, node: sys::CUgraphNode, params: *const sys::CUDA_MEMSET_NODE_PARAMS, ctx: sys::CUcontext);
    /// `cuGraphMemcpyNodeSetParams`.
    fn cuGraphMemcpyNodeSetParams(node: sys::CUgraphNode, params: *const sys::CUDA_MEMCPY3D);
    /// `cuGraphExecMemcpyNodeSetParams`.
    fn cuGraphExecMemcpyNodeSetParams(exec: sys::CUgraphExec, node: sys::CUgraphNode, params: *const sys::CUDA_MEMCPY3D, ctx: sys::CUcontext);

    // Building graphs (the tests').
    /// `cuGraphCreate`.
    fn cuGraphCreate(graph: *mut sys::CUgraph, flags: c_uint);
    /// `cuGraphAddChildGraphNode`.
    fn cuGraphAddChildGraphNode(node: *mut sys::CUgraphNode, graph: sys::CUgraph, deps: *const sys::CUgraphNode, count: usize, child: sys::CUgraph);
    /// `cuGraphAddEmptyNode`.
    fn cuGraphAddEmptyNode(node: *mut sys::CUgraphNode, graph: sys::CUgraph, deps: *const sys::CUgraphNode, count: usize);
    /// `cuGraphConditionalHandleCreate`.
    fn cuGraphConditionalHandleCreate(handle: *mut sys::CUgraphConditionalHandle, graph: sys::CUgraph, ctx: sys::CUcontext, default_value: c_uint, flags: c_uint);
    /// `cuGraphAddNode`.
    fn cuGraphAddNode(node: *mut sys::CUgraphNode, graph: sys::CUgraph, deps: *const sys::CUgraphNode, count: usize, params: *mut sys::CUgraphNodeParams);
    /// `cuStreamBeginCaptureToGraph`.
    fn cuStreamBeginCaptureToGraph(stream: sys::CUstream, graph: sys::CUgraph, deps: *const sys::CUgraphNode, edge_data: *const sys::CUgraphEdgeData, count: usize, mode: sys::CUstreamCaptureMode);
    /// `cuEventRecordWithFlags`.
    fn cuEventRecordWithFlags(event: sys::CUevent, stream: sys::CUstream, flags: c_uint);

    // Virtual memory and pinned host memory (the sleep allocator's).
    /// `cuCtxGetDevice`.
    fn cuCtxGetDevice(device: *mut sys::CUdevice);
    /// `cuCtxPushCurrent_v2`.
    fn cuCtxPushCurrent_v2(ctx: sys::CUcontext);
    /// `cuCtxPopCurrent_v2`.
    fn cuCtxPopCurrent_v2(ctx: *mut sys::CUcontext);
    /// `cuMemGetAllocationGranularity`.
    fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const sys::CUmemAllocationProp, option: sys::CUmemAllocationGranularity_flags);
    /// `cuMemAddressReserve`.
    fn cuMemAddressReserve(ptr: *mut sys::CUdeviceptr, size: usize, alignment: usize, addr: sys::CUdeviceptr, flags: c_ulonglong);
    /// `cuMemAddressFree`.
    fn cuMemAddressFree(ptr: sys::CUdeviceptr, size: usize);
    /// `cuMemCreate`.
    fn cuMemCreate(handle: *mut sys::CUmemGenericAllocationHandle, size: usize, prop: *const sys::CUmemAllocationProp, flags: c_ulonglong);
    /// `cuMemMap`.
    fn cuMemMap(ptr: sys::CUdeviceptr, size: usize, offset: usize, handle: sys::CUmemGenericAllocationHandle, flags: c_ulonglong);
    /// `cuMemSetAccess`.
    fn cuMemSetAccess(ptr: sys::CUdeviceptr, size: usize, desc: *const sys::CUmemAccessDesc, count: usize);
    /// `cuMemUnmap`.
    fn cuMemUnmap(ptr: sys::CUdeviceptr, size: usize);
    /// `cuMemRelease`.
    fn cuMemRelease(handle: sys::CUmemGenericAllocationHandle);
    /// `cuMemHostRegister_v2`.
    fn cuMemHostRegister_v2(p: *mut c_void, size: usize, flags: c_uint);
    /// `cuMemHostUnregister`.
    fn cuMemHostUnregister(p: *mut c_void);
}
