//! `gc128` digests of device tensors: views planned here (merged layouts, checked), their
//! lane sums computed by the driver layer's kernel in one launch per call, finalized with
//! the CPU twin's code ([`crate::digest`]), so a digest is the same wherever it
//! was computed.
//!
//! NVRTC is loaded once per process (from the path the caller found, else by name), the
//! kernel compiled once per GPU architecture and loaded once per device; a failure to load
//! NVRTC, to compile, or to load the CUBIN (a driver that cannot take it) is
//! [`GpuDigestError::Unavailable`], after which callers digest on the host.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use graphcheck_driver::digest::{
    self as kernel, Constants, DigestError, DigestKernel, DigestView, Tuning,
};
use graphcheck_driver::nvrtc::{Nvrtc, NvrtcError};

use crate::digest::{self as gc, DigestText, Lanes, Located, View, ViewError};
use crate::model::format::Digest;

/// Why device views could not be digested.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GpuDigestError {
    /// NVRTC could not be loaded or could not compile the kernel, or the driver could not
    /// load it: digest on the host.
    #[error("the GPU digest is unavailable: {0}")]
    Unavailable(String),
    /// A view that cannot be read (a bad layout), by its position in the call.
    #[error("view {index}: {error}")]
    View { index: usize, error: ViewError },
    /// The driver or the launch failed.
    #[error("failed to digest on the GPU: {0}")]
    Kernel(DigestError),
    /// `GRAPHCHECK_DIGEST_TUNING` does not parse.
    #[error("{TUNING_ENV}: {0}")]
    Tuning(String),
}

/// The environment variable that tunes the kernel's launch (`unroll=8,min_blocks=3`; see
/// `graphcheck_driver::digest::Tuning`), read when a device's kernel is first loaded. The
/// digests do not depend on it.
pub const TUNING_ENV: &str = "GRAPHCHECK_DIGEST_TUNING";

impl From<DigestError> for GpuDigestError {
    fn from(e: DigestError) -> Self {
        match e {
            DigestError::Nvrtc(e) => GpuDigestError::Unavailable(e.to_string()),
            e => GpuDigestError::Kernel(e),
        }
    }
}

impl From<NvrtcError> for GpuDigestError {
    fn from(e: NvrtcError) -> Self {
        GpuDigestError::Unavailable(e.to_string())
    }
}

impl From<graphcheck_driver::Error> for GpuDigestError {
    fn from(e: graphcheck_driver::Error) -> Self {
        GpuDigestError::Kernel(e.into())
    }
}

/// A device view: the address of its first element and its strided layout.
#[derive(Clone, Debug)]
pub struct DeviceView {
    pub addr: u64,
    pub shape: Vec<u64>,
    /// In elements.
    pub stride: Vec<i64>,
    pub itemsize: u32,
}

/// The constants the kernel is compiled with: the twin's.
pub const CONSTANTS: Constants = Constants {
    key_a: gc::KEY_A,
    key_b: gc::KEY_B,
    fmix_1: gc::FMIX_1,
    fmix_2: gc::FMIX_2,
};

static NVRTC: Mutex<Option<Arc<Nvrtc>>> = Mutex::new(None);
/// CUBINs by architecture (`sm_90`) and tuning.
type Cubins = HashMap<(String, Tuning), Arc<Vec<u8>>>;
static CUBINS: Mutex<Option<Cubins>> = Mutex::new(None);
/// Loaded kernels by device ordinal.
static KERNELS: Mutex<Option<HashMap<i32, Arc<DigestKernel>>>> = Mutex::new(None);

/// NVRTC, loaded on first use (a failed load is tried again at the next call).
pub fn nvrtc(path: Option<&Path>) -> Result<Arc<Nvrtc>, NvrtcError> {
    let mut slot = NVRTC.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(n) = slot.as_ref() {
        return Ok(n.clone());
    }
    let n = Arc::new(Nvrtc::load(path)?);
    *slot = Some(n.clone());
    Ok(n)
}

/// NVRTC where the GPU digest has loaded it.
pub fn loaded_nvrtc() -> Option<Arc<Nvrtc>> {
    NVRTC.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// The kernel loaded on device `ordinal`, where it has been.
pub fn loaded_kernel(ordinal: i32) -> Option<Arc<DigestKernel>> {
    let kernels = KERNELS.lock().unwrap_or_else(PoisonError::into_inner);
    kernels.as_ref().and_then(|k| k.get(&ordinal)).cloned()
}

/// The kernel loaded on device `ordinal`, compiled first where this architecture has no
/// CUBIN yet. Loading and compiling happen under the lock: two threads never compile twice.
pub fn kernel_for(
    ordinal: i32,
    nvrtc_path: Option<&Path>,
) -> Result<Arc<DigestKernel>, GpuDigestError> {
    let mut kernels = KERNELS.lock().unwrap_or_else(PoisonError::into_inner);
    let kernels = kernels.get_or_insert_with(HashMap::new);
    if let Some(k) = kernels.get(&ordinal) {
        return Ok(k.clone());
    }
    let tuning = match std::env::var(TUNING_ENV) {
        Ok(text) => Tuning::parse(&text).map_err(GpuDigestError::Tuning)?,
        Err(_) => Tuning::default(),
    };
    let arch = kernel::architecture(ordinal)?;
    let cubin = {
        let mut cubins = CUBINS.lock().unwrap_or_else(PoisonError::into_inner);
        let cubins = cubins.get_or_insert_with(HashMap::new);
        let key = (arch, tuning);
        match cubins.get(&key) {
            Some(c) => c.clone(),
            None => {
                let nvrtc = nvrtc(nvrtc_path)?;
                let c = Arc::new(kernel::compile(&nvrtc, &key.0, &CONSTANTS, tuning)?);
                cubins.insert(key, c.clone());
                c
            }
        }
    };
    let k = DigestKernel::load(ordinal, &cubin, tuning).map_err(|e| {
        GpuDigestError::Unavailable(format!("the driver could not load the kernel: {e}"))
    })?;
    let k = Arc::new(k);
    kernels.insert(ordinal, k.clone());
    Ok(k)
}

/// The kernel's form of each view: contiguous ones as a byte run, others with their merged
/// layout.
pub fn plan(views: &[DeviceView]) -> Result<Vec<DigestView>, GpuDigestError> {
    views
        .iter()
        .enumerate()
        .map(|(index, v)| {
            let view = View {
                shape: &v.shape,
                stride: &v.stride,
                itemsize: v.itemsize,
            };
            Located::of(v.addr, view)
                .map(|l| kernel_view(&l))
                .map_err(|error| GpuDigestError::View { index, error })
        })
        .collect()
}

/// The kernel's form of a located view.
fn kernel_view(v: &Located) -> DigestView {
    DigestView {
        addr: v.addr,
        nbytes: v.nbytes,
        strided: v.strided.as_ref().map(|l| (l.itemsize, l.dims.clone())),
    }
}

/// The `gc128` digests of device `ordinal`'s views, in one launch on `stream` (a `CUstream`
/// of the device's primary context; 0 for the legacy default stream), waited for.
///
/// The caller promises that every view's elements are live device memory of that device,
/// not written until the call returns, and that `stream` is a live stream of it (see
/// [`DigestKernel::lanes`]).
pub fn digests(
    ordinal: i32,
    stream: u64,
    views: &[DeviceView],
    nvrtc_path: Option<&Path>,
) -> Result<Vec<Digest>, GpuDigestError> {
    let texts = finish(ordinal, stream, &plan(views)?, nvrtc_path)?;
    Ok(texts.iter().map(DigestText::digest).collect())
}

/// [`digests`] of views located already (their layouts checked), under the same promise,
/// as text.
pub fn located_digests(
    ordinal: i32,
    stream: u64,
    views: &[Located],
    nvrtc_path: Option<&Path>,
) -> Result<Vec<DigestText>, GpuDigestError> {
    let planned: Vec<DigestView> = views.iter().map(kernel_view).collect();
    finish(ordinal, stream, &planned, nvrtc_path)
}

/// The digests of planned views: their lane sums from one launch, finalized by the twin.
fn finish(
    ordinal: i32,
    stream: u64,
    planned: &[DigestView],
    nvrtc_path: Option<&Path>,
) -> Result<Vec<DigestText>, GpuDigestError> {
    let k = kernel_for(ordinal, nvrtc_path)?;
    let lanes = k.lanes(stream, planned)?;
    Ok(planned
        .iter()
        .zip(lanes)
        .map(|(v, [a, b])| Lanes { a, b }.text(v.nbytes))
        .collect())
}

/// The `gc128` digests of device memory ranges `(addr, size)` of the current context's
/// device, each read as bytes where it is mapped now and `None` where any part is not
/// ([`graphcheck_driver::mapped_device_range`]): one launch on `stream` for them all, or,
/// where the GPU digest is unavailable, host copies digested by the CPU twin (the same
/// digests), with the reason returned beside them.
pub fn range_digests(
    ranges: &[(u64, u64)],
    stream: u64,
    nvrtc_path: Option<&Path>,
) -> Result<(Vec<Option<Digest>>, Option<String>), GpuDigestError> {
    let driver = |e: graphcheck_driver::DriverError| GpuDigestError::Kernel(DigestError::from(e));
    let mut out = vec![None; ranges.len()];
    let mut readable = Vec::new();
    let mut device = None;
    for (i, &(addr, size)) in ranges.iter().enumerate() {
        if size > 0
            && let Some(d) = graphcheck_driver::mapped_device_range(addr, size).map_err(driver)?
        {
            device = Some(d);
            readable.push(i);
        }
    }
    let Some(device) = device else {
        return Ok((out, None));
    };
    let views: Vec<DeviceView> = readable
        .iter()
        .map(|&i| DeviceView {
            addr: ranges[i].0,
            shape: vec![ranges[i].1],
            stride: vec![1],
            itemsize: 1,
        })
        .collect();
    let (digests, fallback) = match digests(device, stream, &views, nvrtc_path) {
        Ok(d) => (d, None),
        Err(GpuDigestError::Unavailable(why)) => {
            let mut d = Vec::with_capacity(views.len());
            for v in &views {
                let len = usize::try_from(v.shape[0]).map_err(|_| {
                    GpuDigestError::Unavailable(format!(
                        "{} bytes do not fit in memory",
                        v.shape[0]
                    ))
                })?;
                d.push(gc::gc128(
                    &graphcheck_driver::read_device(v.addr, len).map_err(driver)?,
                ));
            }
            (d, Some(why))
        }
        Err(e) => return Err(e),
    };
    for (i, d) in readable.into_iter().zip(digests) {
        out[i] = Some(d);
    }
    Ok((out, fallback))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_are_planned_contiguous_or_with_their_merged_layout() {
        let views = [
            DeviceView {
                addr: 0x100,
                shape: vec![4, 8],
                stride: vec![8, 1],
                itemsize: 2,
            },
            DeviceView {
                addr: 0x200,
                shape: vec![4, 8],
                stride: vec![1, 4],
                itemsize: 2,
            },
            DeviceView {
                addr: 0x300,
                shape: vec![0, 8],
                stride: vec![1, 4],
                itemsize: 2,
            },
        ];
        let p = plan(&views).unwrap();
        assert_eq!(
            (p[0].addr, p[0].nbytes, p[0].strided.clone()),
            (0x100, 64, None)
        );
        assert_eq!(p[1].strided, Some((2, vec![(4, 2), (8, 8)])));
        assert_eq!((p[2].nbytes, p[2].strided.clone()), (0, None));
        let bad = DeviceView {
            stride: vec![1],
            ..views[0].clone()
        };
        let e = plan(&[views[0].clone(), bad]).unwrap_err().to_string();
        assert_eq!(e, "view 1: the view has 2 sizes but 1 strides");
    }

    #[test]
    fn the_kernel_compiles_with_the_twins_constants() {
        let Some(n) =
            graphcheck_driver::nvrtc::for_tests("the_kernel_compiles_with_the_twins_constants")
        else {
            return;
        };
        let cubin = kernel::compile(&n, "sm_90", &CONSTANTS, Tuning::default()).unwrap();
        assert_eq!(&cubin[..4], b"\x7fELF");
    }
}
