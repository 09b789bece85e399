//! The GPU kernels of the `gc128` content digest (`digest.cu`): compiled by NVRTC with the
//! algorithm's constants (graphcheck's CPU twin defines them and passes them in), loaded in
//! a device's primary context, and launched over many views on a caller's stream: one
//! launch for the contiguous views and, where there are any, one for the strided ones. It
//! returns each view's two lane sums; the caller finalizes them with the twin's code.
//!
//! The kernels' argument layout is this module's: views and strided layouts are checked
//! and packed here, so that every accumulator a kernel adds to is inside the buffer it is
//! given. What the kernels read is the caller's promise (see [`DigestKernel::lanes`]).

use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{result, sys};

use crate::nvrtc::{Nvrtc, NvrtcError};
use crate::vmm::PrimaryContext;
use crate::{DriverError, Error};

/// The kernels' CUDA source.
pub const SOURCE: &str = include_str!("digest.cu");
/// The kernels' names in [`SOURCE`]: contiguous views, strided views.
const KERNELS: [&str; 2] = ["gc128_lanes", "gc128_lanes_strided"];
/// Threads per block (`BLOCK` in the source).
const BLOCK: u32 = 256;
/// Dimensions a strided layout may have after merging (`MAX_DIMS` in the source).
pub const MAX_DIMS: usize = 12;
/// A view without a strided layout (`CONTIGUOUS` in the source).
const CONTIGUOUS: u32 = u32::MAX;
/// Bytes of one packed view (`struct Seg`).
const SEG_BYTES: usize = 32;
/// Bytes of one packed layout (`struct Layout`).
const LAYOUT_BYTES: usize = 8 + 16 * MAX_DIMS;
/// Device scratch allocated with the kernels: 1,300 views' accumulators and packed views.
const INITIAL_SCRATCH: usize = 1 << 16;

/// The algorithm's constants, compiled into the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Constants {
    /// Lane A's key multiplier.
    pub key_a: u64,
    /// Lane B's key multiplier.
    pub key_b: u64,
    /// `fmix64`'s first multiplier.
    pub fmix_1: u64,
    /// `fmix64`'s second multiplier.
    pub fmix_2: u64,
}

/// How the contiguous kernel is built: 16-byte loads each thread has in flight per chunk
/// (`unroll`; a chunk is `16 · 256 · unroll` bytes), and the blocks per SM its registers must
/// leave room for (`min_blocks`, 0 for no bound). The digests do not depend on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tuning {
    /// 1 to 16.
    pub unroll: u32,
    /// 0 to 8.
    pub min_blocks: u32,
}

impl Default for Tuning {
    /// 4 loads, no bound: 60 registers on sm_90, 4 blocks of 256 threads per SM.
    fn default() -> Self {
        Tuning {
            unroll: 4,
            min_blocks: 0,
        }
    }
}

impl Tuning {
    /// `unroll=8,min_blocks=3` (either may be left out; the default fills in).
    pub fn parse(text: &str) -> Result<Tuning, String> {
        let mut t = Tuning::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not key=value"))?;
            let value: u32 = value
                .trim()
                .parse()
                .map_err(|_| format!("{part:?}: the value is not a whole number"))?;
            match key.trim() {
                "unroll" if (1..=16).contains(&value) => t.unroll = value,
                "min_blocks" if value <= 8 => t.min_blocks = value,
                "unroll" | "min_blocks" => return Err(format!("{part:?} is out of range")),
                other => return Err(format!("unknown key {other:?} (unroll, min_blocks)")),
            }
        }
        Ok(t)
    }

    /// Bytes per chunk, the unit of work of a block (`CHUNK_WORDS` words in the source).
    pub fn chunk_bytes(&self) -> u64 {
        16 * u64::from(BLOCK) * u64::from(self.unroll)
    }
}

/// One view to digest.
#[derive(Clone, Debug)]
pub struct DigestView {
    /// The device address of its first element.
    pub addr: u64,
    /// Bytes of its row-major element stream.
    pub nbytes: u64,
    /// `None` for a contiguous view; else its element size and merged dimensions, outermost
    /// first, as `(size, stride in bytes)`.
    pub strided: Option<(u32, Vec<(u64, u64)>)>,
}

/// Why the GPU digest could not be computed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DigestError {
    /// NVRTC is missing or failed: the caller may digest on the host instead.
    #[error(transparent)]
    Nvrtc(#[from] NvrtcError),
    /// A driver call failed.
    #[error(transparent)]
    Driver(#[from] Error),
    /// The stream is capturing a graph: a launch would be captured, not run.
    #[error("the stream is capturing a CUDA graph; digest before or after the capture")]
    Capturing,
    /// A view's layout has more dimensions than the kernel takes.
    #[error("view {index} has {dims} dimensions after merging; the GPU digest takes {MAX_DIMS}")]
    TooManyDims {
        /// The view's position.
        index: usize,
        /// Its dimensions.
        dims: usize,
    },
    /// More views than accumulator indexes (32 bits).
    #[error("{0} views in one call; the GPU digest takes at most 2^32 - 1")]
    TooManyViews(usize),
    /// A strided view with a zero element size or a dimension of size 0.
    #[error("view {index} has a malformed strided layout")]
    BadLayout {
        /// The view's position.
        index: usize,
    },
}

impl From<DriverError> for DigestError {
    fn from(e: DriverError) -> Self {
        DigestError::Driver(e.into())
    }
}

/// Device scratch memory, kept between launches and grown when too small; and the two
/// events that time the last launches.
struct Scratch {
    ptr: sys::CUdeviceptr,
    size: usize,
    events: Option<(sys::CUevent, sys::CUevent)>,
    /// The kernels' own time in the last call, in milliseconds (its events).
    last_kernel_ms: f32,
}

/// A kernel of the module and the blocks of it that fit on the device at once.
#[derive(Clone, Copy, Debug)]
struct Kernel {
    func: sys::CUfunction,
    resident: u32,
}

/// The kernels loaded in one device's primary context.
pub struct DigestKernel {
    ctx: Arc<PrimaryContext>,
    module: sys::CUmodule,
    /// Contiguous, strided.
    kernels: [Kernel; 2],
    tuning: Tuning,
    /// Launches on one device are serialized: they share the scratch memory.
    scratch: Mutex<Scratch>,
}

// SAFETY: the module and functions belong to a primary context, a process-wide handle any
// thread may make current; every use pushes it first, and the scratch is behind a mutex.
unsafe impl Send for DigestKernel {}
// SAFETY: as above: `&self` methods push the context and lock the scratch.
unsafe impl Sync for DigestKernel {}

impl std::fmt::Debug for DigestKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DigestKernel")
            .field("device", &self.ctx.ordinal())
            .field("tuning", &self.tuning)
            .field(
                "resident",
                &[self.kernels[0].resident, self.kernels[1].resident],
            )
            .finish()
    }
}

/// `sm_XY` of device `ordinal`.
pub fn architecture(ordinal: i32) -> Result<String, Error> {
    crate::init()?;
    let dev =
        result::device::get(ordinal).map_err(|e| DriverError::from_cudarc("cuDeviceGet", e))?;
    let attr = |a| {
        // SAFETY: a device the driver handed out; reads one attribute.
        unsafe { result::device::get_attribute(dev, a) }
            .map_err(|e| DriverError::from_cudarc("cuDeviceGetAttribute", e))
    };
    use sys::CUdevice_attribute as A;
    let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    Ok(format!("sm_{major}{minor}"))
}

/// Compiles the kernels for `arch` with `constants` and `tuning`.
pub fn compile(
    nvrtc: &Nvrtc,
    arch: &str,
    constants: &Constants,
    tuning: Tuning,
) -> Result<Vec<u8>, NvrtcError> {
    let options = vec![
        format!("-DGC_KEY_A={:#x}ull", constants.key_a),
        format!("-DGC_KEY_B={:#x}ull", constants.key_b),
        format!("-DGC_FMIX_1={:#x}ull", constants.fmix_1),
        format!("-DGC_FMIX_2={:#x}ull", constants.fmix_2),
        format!("-DGC_UNROLL={}", tuning.unroll),
        format!("-DGC_MIN_BLOCKS={}", tuning.min_blocks),
        "--std=c++17".to_string(),
    ];
    nvrtc.compile_cubin(SOURCE, "gc128_digest.cu", arch, &options)
}

impl DigestKernel {
    /// Loads `cubin` (from [`compile`] with `tuning`) in device `ordinal`'s primary context.
    pub fn load(ordinal: i32, cubin: &[u8], tuning: Tuning) -> Result<DigestKernel, Error> {
        crate::init()?;
        let ctx = PrimaryContext::retain(ordinal)?;
        let _current = ctx.enter()?;
        // SAFETY: a CUBIN image NVRTC produced, alive for the call (the driver copies it).
        let module = unsafe { result::module::load_data(cubin.as_ptr().cast()) }
            .map_err(|e| DriverError::from_cudarc("cuModuleLoadData", e))?;
        let none = Kernel {
            func: std::ptr::null_mut(),
            resident: 0,
        };
        // Owned from here: an error below unloads the module through the drop.
        let mut kernel = DigestKernel {
            ctx,
            module,
            kernels: [none; 2],
            tuning,
            scratch: Mutex::new(Scratch {
                ptr: 0,
                size: 0,
                events: None,
                last_kernel_ms: 0.0,
            }),
        };
        let dev =
            result::device::get(ordinal).map_err(|e| DriverError::from_cudarc("cuDeviceGet", e))?;
        // SAFETY: a device the driver handed out.
        let sms = unsafe {
            result::device::get_attribute(
                dev,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
        }
        .map_err(|e| DriverError::from_cudarc("cuDeviceGetAttribute", e))?;
        for (slot, name) in kernel.kernels.iter_mut().zip(KERNELS) {
            let cname = CString::new(name).expect("no NUL");
            // SAFETY: a module loaded above and not unloaded.
            let func = unsafe { result::module::get_function(module, cname) }
                .map_err(|e| DriverError::from_cudarc("cuModuleGetFunction", e))?;
            // SAFETY: a function of the loaded module.
            let per_sm = unsafe {
                result::occupancy::max_active_block_per_multiprocessor(func, BLOCK as i32, 0)
            }
            .map_err(|e| {
                DriverError::from_cudarc("cuOccupancyMaxActiveBlocksPerMultiprocessor", e)
            })?;
            *slot = Kernel {
                func,
                resident: (sms.max(1) * per_sm.max(1)) as u32,
            };
        }
        // Scratch and events made now, so that a later call allocates only for a larger
        // batch: a device allocation is refused while another stream captures in global
        // mode.
        let scratch = kernel
            .scratch
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        scratch.events = Some(events()?);
        // SAFETY: plain device memory, freed by a growth in `lanes` or the drop.
        scratch.ptr = unsafe { result::malloc_sync(INITIAL_SCRATCH) }
            .map_err(|e| DriverError::from_cudarc("cuMemAlloc", e))?;
        scratch.size = INITIAL_SCRATCH;
        Ok(kernel)
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> i32 {
        self.ctx.ordinal()
    }

    /// How the kernels were built.
    pub fn tuning(&self) -> Tuning {
        self.tuning
    }

    /// The lane sums `[a, b]` of each view, in one launch per kind of view (contiguous,
    /// strided) on `stream` (a `CUstream` of this device's primary context, as
    /// `torch.cuda.current_stream().cuda_stream` gives it; 0 for the legacy default stream),
    /// then waits for the stream. Views of 0 bytes have sums 0 and are not sent.
    ///
    /// # Soundness
    /// Safe to call under the promise its callers document, which no code can check: every
    /// view's bytes (its elements, through its strides) are device memory readable from
    /// this context until the call returns, and `stream` is a live stream of this context.
    /// The kernels only read there; they write only the scratch accumulators this function
    /// allocates, at indexes checked here. A view that is not readable memory makes the
    /// launch fail with an illegal-address error (which CUDA makes sticky for the context).
    pub fn lanes(&self, stream: u64, views: &[DigestView]) -> Result<Vec<[u64; 2]>, DigestError> {
        let packed = Packed::of(views, self.tuning.chunk_bytes())?;
        let mut out = vec![[0u64; 2]; views.len()];
        if packed.lists.iter().all(|l| l.total_chunks == 0) {
            return Ok(out);
        }
        let stream = stream as usize as sys::CUstream;
        let _current = self.ctx.enter()?;
        // SAFETY: the caller promises a live stream of this context.
        let status = unsafe { result::stream::is_capturing(stream) }
            .map_err(|e| DriverError::from_cudarc("cuStreamIsCapturing", e))?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(DigestError::Capturing);
        }
        // The scratch: accumulators, then each list of views, then the layouts (every part
        // a multiple of 16 bytes long, so each starts aligned).
        let acc_bytes = 16 * views.len();
        let lists_at = [acc_bytes, acc_bytes + packed.lists[0].segs.len()];
        let layouts_at = lists_at[1] + packed.lists[1].segs.len();
        let need = layouts_at + packed.layouts.len();
        let mut scratch = self.scratch.lock().unwrap_or_else(PoisonError::into_inner);
        if scratch.size < need {
            if scratch.ptr != 0 {
                // SAFETY: allocated below by an earlier call, which waited for its stream
                // before returning: no launch uses it any more.
                let _ = unsafe { result::memory_free(scratch.ptr) };
                (scratch.ptr, scratch.size) = (0, 0);
            }
            let size = need.next_power_of_two().max(INITIAL_SCRATCH);
            // SAFETY: plain device memory, freed by the next growth or the drop.
            let ptr = unsafe { result::malloc_sync(size) }
                .map_err(|e| DriverError::from_cudarc("cuMemAlloc", e))?;
            (scratch.ptr, scratch.size) = (ptr, size);
        }
        let (start, end) = scratch.events.expect("made by `load`");
        let base = scratch.ptr;
        let layouts_ptr = base + layouts_at as u64;
        let mut acc = vec![0u64; 2 * views.len()];
        // SAFETY: the scratch holds `need` bytes: the accumulators at 0, the packed views
        // and layouts after them; every copy stays inside it and is ordered on `stream`
        // before the launches. Host sources are pageable, so the copies have read them when
        // the calls return; the copy back into `acc` is complete when the stream is waited
        // for, before `acc` is read. Each kernel gets the parameters of its signature in
        // `digest.cu`, and every accumulator index packed is below `views.len()`.
        unsafe {
            result::memset_d8_async(base, 0, acc_bytes, stream)
                .map_err(|e| DriverError::from_cudarc("cuMemsetD8Async", e))?;
            for (list, at) in packed.lists.iter().zip(lists_at) {
                if list.count > 0 {
                    result::memcpy_htod_async(base + at as u64, &list.segs, stream)
                        .map_err(|e| DriverError::from_cudarc("cuMemcpyHtoDAsync", e))?;
                }
            }
            if !packed.layouts.is_empty() {
                result::memcpy_htod_async(layouts_ptr, &packed.layouts, stream)
                    .map_err(|e| DriverError::from_cudarc("cuMemcpyHtoDAsync", e))?;
            }
            result::event::record(start, stream)
                .map_err(|e| DriverError::from_cudarc("cuEventRecord", e))?;
            for ((list, at), kernel) in packed.lists.iter().zip(lists_at).zip(self.kernels) {
                if list.count == 0 {
                    continue;
                }
                let blocks = list.total_chunks.min(u64::from(kernel.resident.max(1)));
                let per_block = list.total_chunks.div_ceil(blocks);
                let grid = list.total_chunks.div_ceil(per_block) as u32;
                let (mut a0, mut a1, mut a2, mut a3, mut a4, mut a5) = (
                    base + at as u64,
                    list.count,
                    layouts_ptr,
                    base,
                    list.total_chunks,
                    per_block,
                );
                // In order: segs, nsegs, layouts, acc, total, per_block.
                let mut params: [*mut c_void; 6] = [
                    (&mut a0 as *mut u64).cast(),
                    (&mut a1 as *mut u32).cast(),
                    (&mut a2 as *mut u64).cast(),
                    (&mut a3 as *mut u64).cast(),
                    (&mut a4 as *mut u64).cast(),
                    (&mut a5 as *mut u64).cast(),
                ];
                result::launch_kernel(
                    kernel.func,
                    (grid, 1, 1),
                    (BLOCK, 1, 1),
                    0,
                    stream,
                    &mut params,
                )
                .map_err(|e| DriverError::from_cudarc("cuLaunchKernel", e))?;
            }
            result::event::record(end, stream)
                .map_err(|e| DriverError::from_cudarc("cuEventRecord", e))?;
            result::memcpy_dtoh_async(&mut acc, base, stream)
                .map_err(|e| DriverError::from_cudarc("cuMemcpyDtoHAsync", e))?;
            result::stream::synchronize(stream)
                .map_err(|e| DriverError::from_cudarc("cuStreamSynchronize", e))?;
            // Both events were recorded on `stream`, which has been waited for.
            scratch.last_kernel_ms = result::event::elapsed(start, end)
                .map_err(|e| DriverError::from_cudarc("cuEventElapsedTime", e))?;
        }
        for (o, pair) in out.iter_mut().zip(acc.chunks_exact(2)) {
            *o = [pair[0], pair[1]];
        }
        Ok(out)
    }

    /// The kernels' own time in the last call (between events recorded on the stream right
    /// before and after the launches), in seconds; 0 before the first launch.
    pub fn last_kernel_seconds(&self) -> f64 {
        let scratch = self.scratch.lock().unwrap_or_else(PoisonError::into_inner);
        f64::from(scratch.last_kernel_ms) / 1e3
    }

    /// Bytes of device scratch memory held (accumulators and packed views of the largest
    /// launch so far, rounded up to a power of two).
    pub fn scratch_bytes(&self) -> usize {
        self.scratch
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .size
    }
}

/// Two timing events, destroyed by [`DigestKernel`]'s drop.
fn events() -> Result<(sys::CUevent, sys::CUevent), DriverError> {
    let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
    let start =
        result::event::create(flags).map_err(|e| DriverError::from_cudarc("cuEventCreate", e))?;
    match result::event::create(flags) {
        Ok(end) => Ok((start, end)),
        Err(e) => {
            // SAFETY: created above, destroyed once.
            let _ = unsafe { result::event::destroy(start) };
            Err(DriverError::from_cudarc("cuEventCreate", e))
        }
    }
}

impl Drop for DigestKernel {
    fn drop(&mut self) {
        if let Ok(_current) = self.ctx.enter() {
            let scratch = self
                .scratch
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner);
            if scratch.ptr != 0 {
                // SAFETY: allocated by `lanes`, whose launches have all been waited for.
                let _ = unsafe { result::memory_free(scratch.ptr) };
            }
            if let Some((start, end)) = scratch.events.take() {
                // SAFETY: created by `lanes`, destroyed once; their streams were waited for.
                let _ = unsafe { result::event::destroy(start) };
                // SAFETY: as above.
                let _ = unsafe { result::event::destroy(end) };
            }
            // SAFETY: loaded by `load`, unloaded once; no launch is in flight.
            let _ = unsafe { result::module::unload(self.module) };
        }
    }
}

/// The views of one kernel in its binary layout.
#[derive(Debug, Default)]
struct List {
    segs: Vec<u8>,
    count: u32,
    total_chunks: u64,
}

/// Views and layouts in the kernels' binary layout: contiguous views, strided views.
#[derive(Debug, Default)]
struct Packed {
    lists: [List; 2],
    layouts: Vec<u8>,
}

impl Packed {
    /// Packs the views of more than 0 bytes; each keeps its position as its accumulator.
    fn of(views: &[DigestView], chunk_bytes: u64) -> Result<Packed, DigestError> {
        if u32::try_from(views.len()).is_err() {
            return Err(DigestError::TooManyViews(views.len()));
        }
        let mut p = Packed::default();
        for (index, v) in views.iter().enumerate() {
            if v.nbytes == 0 {
                continue;
            }
            let (layout, list) = match &v.strided {
                None => (CONTIGUOUS, 0),
                Some((itemsize, dims)) => {
                    if dims.len() > MAX_DIMS {
                        return Err(DigestError::TooManyDims {
                            index,
                            dims: dims.len(),
                        });
                    }
                    if *itemsize == 0 || dims.iter().any(|d| d.0 == 0) {
                        return Err(DigestError::BadLayout { index });
                    }
                    let at = (p.layouts.len() / LAYOUT_BYTES) as u32;
                    let mut rec = [0u8; LAYOUT_BYTES];
                    rec[0..4].copy_from_slice(&(dims.len() as u32).to_le_bytes());
                    rec[4..8].copy_from_slice(&itemsize.to_le_bytes());
                    for (d, &(size, stride)) in dims.iter().enumerate() {
                        rec[8 + 8 * d..16 + 8 * d].copy_from_slice(&size.to_le_bytes());
                        let s = 8 + 8 * MAX_DIMS + 8 * d;
                        rec[s..s + 8].copy_from_slice(&stride.to_le_bytes());
                    }
                    p.layouts.extend_from_slice(&rec);
                    (at, 1)
                }
            };
            let l = &mut p.lists[list];
            let mut rec = [0u8; SEG_BYTES];
            rec[0..8].copy_from_slice(&v.addr.to_le_bytes());
            rec[8..16].copy_from_slice(&v.nbytes.to_le_bytes());
            rec[16..24].copy_from_slice(&l.total_chunks.to_le_bytes());
            rec[24..28].copy_from_slice(&(index as u32).to_le_bytes());
            rec[28..32].copy_from_slice(&layout.to_le_bytes());
            l.segs.extend_from_slice(&rec);
            l.count += 1;
            l.total_chunks += v.nbytes.div_ceil(chunk_bytes);
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests;
