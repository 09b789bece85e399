//! The GPU kernel of the `gc128` content digest (`digest.cu`): compiled by NVRTC with the
//! algorithm's constants (graphcheck's CPU twin defines them and passes them in), loaded in
//! a device's primary context, and launched once over many views on a caller's stream.
//! It returns each view's two lane sums; the caller finalizes them with the twin's code.
//!
//! The kernel's argument layout is this module's: views and strided layouts are checked
//! and packed here, so that every accumulator the kernel adds to is inside the buffer it
//! is given. What the kernel reads is the caller's promise (see [`DigestKernel::lanes`]).

use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{result, sys};

use crate::nvrtc::{Nvrtc, NvrtcError};
use crate::vmm::PrimaryContext;
use crate::{DriverError, Error};

/// The kernel's CUDA source.
pub const SOURCE: &str = include_str!("digest.cu");
/// The kernel's name in [`SOURCE`].
const KERNEL: &str = "gc128_lanes";
/// Threads per block (`BLOCK` in the source).
const BLOCK: u32 = 256;
/// Bytes per chunk, the unit of work of a block (`CHUNK_WORDS` words in the source).
pub const CHUNK_BYTES: u64 = 8 * 2 * 256 * 4;
/// Dimensions a strided layout may have after merging (`MAX_DIMS` in the source).
pub const MAX_DIMS: usize = 12;
/// A view without a strided layout (`CONTIGUOUS` in the source).
const CONTIGUOUS: u32 = u32::MAX;
/// Bytes of one packed view (`struct Seg`).
const SEG_BYTES: usize = 32;
/// Bytes of one packed layout (`struct Layout`).
const LAYOUT_BYTES: usize = 8 + 16 * MAX_DIMS;

/// The algorithm's constants, compiled into the kernel.
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
/// events that time the last launch.
struct Scratch {
    ptr: sys::CUdeviceptr,
    size: usize,
    events: Option<(sys::CUevent, sys::CUevent)>,
    /// The kernel's own time in the last call, in milliseconds (its events).
    last_kernel_ms: f32,
}

/// The kernel loaded in one device's primary context.
pub struct DigestKernel {
    ctx: Arc<PrimaryContext>,
    module: sys::CUmodule,
    func: sys::CUfunction,
    /// Blocks that fit on the device at once (SMs × blocks per SM).
    resident: u32,
    /// Launches on one device are serialized: they share the scratch memory.
    scratch: Mutex<Scratch>,
}

// SAFETY: the module and function belong to a primary context, a process-wide handle any
// thread may make current; every use pushes it first, and the scratch is behind a mutex.
unsafe impl Send for DigestKernel {}
// SAFETY: as above: `&self` methods push the context and lock the scratch.
unsafe impl Sync for DigestKernel {}

impl std::fmt::Debug for DigestKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DigestKernel")
            .field("device", &self.ctx.ordinal())
            .field("resident", &self.resident)
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

/// Compiles the kernel for `arch` with `constants`.
pub fn compile(nvrtc: &Nvrtc, arch: &str, constants: &Constants) -> Result<Vec<u8>, NvrtcError> {
    let options = vec![
        format!("-DGC_KEY_A={:#x}ull", constants.key_a),
        format!("-DGC_KEY_B={:#x}ull", constants.key_b),
        format!("-DGC_FMIX_1={:#x}ull", constants.fmix_1),
        format!("-DGC_FMIX_2={:#x}ull", constants.fmix_2),
        "--std=c++17".to_string(),
    ];
    nvrtc.compile_cubin(SOURCE, "gc128_digest.cu", arch, &options)
}

impl DigestKernel {
    /// Loads `cubin` (from [`compile`]) in device `ordinal`'s primary context.
    pub fn load(ordinal: i32, cubin: &[u8]) -> Result<DigestKernel, Error> {
        crate::init()?;
        let ctx = PrimaryContext::retain(ordinal)?;
        let _current = ctx.enter()?;
        // SAFETY: a CUBIN image NVRTC produced, alive for the call (the driver copies it).
        let module = unsafe { result::module::load_data(cubin.as_ptr().cast()) }
            .map_err(|e| DriverError::from_cudarc("cuModuleLoadData", e))?;
        let name = CString::new(KERNEL).expect("no NUL");
        // SAFETY: a module just loaded.
        let func = match unsafe { result::module::get_function(module, name) } {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: loaded above, unloaded once.
                let _ = unsafe { result::module::unload(module) };
                return Err(DriverError::from_cudarc("cuModuleGetFunction", e).into());
            }
        };
        // Owned from here: an error below unloads the module through the drop.
        let mut kernel = DigestKernel {
            ctx,
            module,
            func,
            resident: 0,
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
        // SAFETY: a function of the loaded module.
        let per_sm = unsafe {
            result::occupancy::max_active_block_per_multiprocessor(func, BLOCK as i32, 0)
        }
        .map_err(|e| DriverError::from_cudarc("cuOccupancyMaxActiveBlocksPerMultiprocessor", e))?;
        kernel.resident = (sms.max(1) * per_sm.max(1)) as u32;
        Ok(kernel)
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> i32 {
        self.ctx.ordinal()
    }

    /// The lane sums `[a, b]` of each view, in one launch on `stream` (a `CUstream` of this
    /// device's primary context, as `torch.cuda.current_stream().cuda_stream` gives it; 0
    /// for the legacy default stream), then waits for the stream. Views of 0 bytes have
    /// sums 0 and are not sent.
    ///
    /// # Soundness
    /// Safe to call under the promise its callers document, which no code can check: every
    /// view's bytes (its elements, through its strides) are device memory readable from
    /// this context until the call returns, and `stream` is a live stream of this context.
    /// The kernel only reads there; it writes only the scratch accumulators this function
    /// allocates, at indexes checked here. A view that is not readable memory makes the
    /// launch fail with an illegal-address error (which CUDA makes sticky for the context).
    pub fn lanes(&self, stream: u64, views: &[DigestView]) -> Result<Vec<[u64; 2]>, DigestError> {
        let packed = Packed::of(views)?;
        let mut out = vec![[0u64; 2]; views.len()];
        if packed.total_chunks == 0 {
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
        let acc_bytes = 16 * views.len();
        let (segs_at, layouts_at) = (acc_bytes, acc_bytes + packed.segs.len());
        let need = layouts_at + packed.layouts.len();
        let mut scratch = self.scratch.lock().unwrap_or_else(PoisonError::into_inner);
        if scratch.size < need {
            if scratch.ptr != 0 {
                // SAFETY: allocated below by an earlier call, which waited for its stream
                // before returning: no launch uses it any more.
                let _ = unsafe { result::memory_free(scratch.ptr) };
                (scratch.ptr, scratch.size) = (0, 0);
            }
            let size = need.next_power_of_two().max(1 << 16);
            // SAFETY: plain device memory, freed by the next growth or never (the kernel is
            // kept for the process).
            let ptr = unsafe { result::malloc_sync(size) }
                .map_err(|e| DriverError::from_cudarc("cuMemAlloc", e))?;
            (scratch.ptr, scratch.size) = (ptr, size);
        }
        if scratch.events.is_none() {
            let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
            let start = result::event::create(flags)
                .map_err(|e| DriverError::from_cudarc("cuEventCreate", e))?;
            let end = match result::event::create(flags) {
                Ok(end) => end,
                Err(e) => {
                    // SAFETY: created above, destroyed once.
                    let _ = unsafe { result::event::destroy(start) };
                    return Err(DriverError::from_cudarc("cuEventCreate", e).into());
                }
            };
            scratch.events = Some((start, end));
        }
        let (start, end) = scratch.events.expect("made above");
        let base = scratch.ptr;
        let mut acc = vec![0u64; 2 * views.len()];
        let (segs_ptr, layouts_ptr) = (base + segs_at as u64, base + layouts_at as u64);
        let blocks = packed.total_chunks.min(u64::from(self.resident.max(1)));
        let per_block = packed.total_chunks.div_ceil(blocks);
        let grid = packed.total_chunks.div_ceil(per_block) as u32;
        // SAFETY: the scratch holds `need` bytes: the accumulators at 0, the packed views
        // and layouts after them; every copy stays inside it and is ordered on `stream`
        // before the launch. Host sources are pageable, so the copies have read them when
        // the calls return; the copy back into `acc` is complete when the stream is waited
        // for, before `acc` is read.
        unsafe {
            result::memset_d8_async(base, 0, acc_bytes, stream)
                .map_err(|e| DriverError::from_cudarc("cuMemsetD8Async", e))?;
            result::memcpy_htod_async(segs_ptr, &packed.segs, stream)
                .map_err(|e| DriverError::from_cudarc("cuMemcpyHtoDAsync", e))?;
            if !packed.layouts.is_empty() {
                result::memcpy_htod_async(layouts_ptr, &packed.layouts, stream)
                    .map_err(|e| DriverError::from_cudarc("cuMemcpyHtoDAsync", e))?;
            }
            let (mut a0, mut a1, mut a2, mut a3, mut a4, mut a5) = (
                segs_ptr,
                packed.count,
                layouts_ptr,
                base,
                packed.total_chunks,
                per_block,
            );
            // The kernel's parameters, in order: segs, nsegs, layouts, acc, total, per_block.
            let mut params: [*mut c_void; 6] = [
                (&mut a0 as *mut u64).cast(),
                (&mut a1 as *mut u32).cast(),
                (&mut a2 as *mut u64).cast(),
                (&mut a3 as *mut u64).cast(),
                (&mut a4 as *mut u64).cast(),
                (&mut a5 as *mut u64).cast(),
            ];
            result::event::record(start, stream)
                .map_err(|e| DriverError::from_cudarc("cuEventRecord", e))?;
            result::launch_kernel(
                self.func,
                (grid, 1, 1),
                (BLOCK, 1, 1),
                0,
                stream,
                &mut params,
            )
            .map_err(|e| DriverError::from_cudarc("cuLaunchKernel", e))?;
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

    /// The kernel's own time in the last call (between events recorded on the stream right
    /// before and after the launch), in seconds; 0 before the first launch.
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

/// Views and layouts in the kernel's binary layout.
#[derive(Debug, Default)]
struct Packed {
    segs: Vec<u8>,
    layouts: Vec<u8>,
    count: u32,
    total_chunks: u64,
}

impl Packed {
    /// Packs the views of more than 0 bytes; each keeps its position as its accumulator.
    fn of(views: &[DigestView]) -> Result<Packed, DigestError> {
        let mut p = Packed::default();
        for (index, v) in views.iter().enumerate() {
            if v.nbytes == 0 {
                continue;
            }
            let layout = match &v.strided {
                None => CONTIGUOUS,
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
                    at
                }
            };
            let mut rec = [0u8; SEG_BYTES];
            rec[0..8].copy_from_slice(&v.addr.to_le_bytes());
            rec[8..16].copy_from_slice(&v.nbytes.to_le_bytes());
            rec[16..24].copy_from_slice(&p.total_chunks.to_le_bytes());
            rec[24..28].copy_from_slice(&(index as u32).to_le_bytes());
            rec[28..32].copy_from_slice(&layout.to_le_bytes());
            p.segs.extend_from_slice(&rec);
            p.count += 1;
            p.total_chunks += v.nbytes.div_ceil(CHUNK_BYTES);
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_follows_the_kernels_structs() {
        let views = [
            DigestView {
                addr: 0x1000,
                nbytes: CHUNK_BYTES + 1,
                strided: None,
            },
            DigestView {
                addr: 0x9000,
                nbytes: 0,
                strided: None,
            },
            DigestView {
                addr: 0x2000,
                nbytes: 48,
                strided: Some((4, vec![(4, 16), (3, 4)])),
            },
        ];
        let p = Packed::of(&views).unwrap();
        assert_eq!((p.count, p.total_chunks), (2, 3));
        assert_eq!(p.segs.len(), 2 * SEG_BYTES);
        let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        // The second packed view is view 2 (view 1 is empty), its chunks after view 0's two.
        let s = &p.segs[SEG_BYTES..];
        assert_eq!((u64_at(s, 0), u64_at(s, 8), u64_at(s, 16)), (0x2000, 48, 2));
        assert_eq!((u32_at(s, 24), u32_at(s, 28)), (2, 0));
        assert_eq!(u32_at(&p.segs, 28), CONTIGUOUS);
        let l = &p.layouts;
        assert_eq!(l.len(), LAYOUT_BYTES);
        assert_eq!((u32_at(l, 0), u32_at(l, 4)), (2, 4));
        assert_eq!((u64_at(l, 8), u64_at(l, 16)), (4, 3));
        assert_eq!(
            (u64_at(l, 8 + 8 * MAX_DIMS), u64_at(l, 16 + 8 * MAX_DIMS)),
            (16, 4)
        );
    }

    #[test]
    fn the_source_and_the_constants_here_agree() {
        for (name, value) in [
            ("BLOCK", BLOCK as u64),
            ("UNROLL", CHUNK_BYTES / 16 / BLOCK as u64),
            ("MAX_DIMS", MAX_DIMS as u64),
        ] {
            assert!(
                SOURCE.contains(&format!("#define {name} {value}\n")),
                "{name} is {value} here"
            );
        }
        assert!(SOURCE.contains("#define CHUNK_WORDS (2 * BLOCK * UNROLL)"));
        assert!(SOURCE.contains(&format!("void __launch_bounds__(BLOCK)\n{KERNEL}(")));
    }

    #[test]
    fn a_layout_the_kernel_cannot_take_is_an_error() {
        let deep = DigestView {
            addr: 0,
            nbytes: 8,
            strided: Some((1, vec![(2, 1); MAX_DIMS + 1])),
        };
        assert!(matches!(
            Packed::of(&[deep]),
            Err(DigestError::TooManyDims { index: 0, dims: 13 })
        ));
        let empty_dim = DigestView {
            addr: 0,
            nbytes: 8,
            strided: Some((1, vec![(0, 1), (8, 1)])),
        };
        assert!(matches!(
            Packed::of(&[empty_dim]),
            Err(DigestError::BadLayout { index: 0 })
        ));
    }

    /// NVRTC where `GRAPHCHECK_NVRTC` names it or a usual name loads; `None` says skipped.
    fn nvrtc() -> Option<Nvrtc> {
        let path = std::env::var_os("GRAPHCHECK_NVRTC").map(std::path::PathBuf::from);
        match Nvrtc::load(path.as_deref()) {
            Ok(n) => Some(n),
            Err(e) => {
                eprintln!("skipped: no NVRTC (set GRAPHCHECK_NVRTC to libnvrtc's path): {e}");
                None
            }
        }
    }

    #[test]
    fn the_kernel_compiles_for_hopper_where_nvrtc_is_found() {
        let Some(nvrtc) = nvrtc() else { return };
        let constants = Constants {
            key_a: 3,
            key_b: 5,
            fmix_1: 7,
            fmix_2: 9,
        };
        let cubin = compile(&nvrtc, "sm_90", &constants).unwrap();
        // An ELF image.
        assert_eq!(&cubin[..4], b"\x7fELF", "NVRTC {:?}", nvrtc.version());
    }

    #[test]
    fn the_kernel_does_not_compile_without_the_constants() {
        let Some(nvrtc) = nvrtc() else { return };
        let e = nvrtc
            .compile_cubin(SOURCE, "gc128_digest.cu", "sm_90", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("compile with the digest's constants"), "{e}");
    }
}
