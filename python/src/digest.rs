//! The `gc128` content digest in `graphcheck._native`: of bytes, of CPU tensors read in
//! place (no copy), and of CUDA tensors, many per call in one kernel launch. The views are
//! a `TensorViews` (tensors or a registry's metadata, read by [`views`]) or tuples
//! `(address of its first element, sizes, strides in elements, element size)`.
//!
//! The GPU path raises `GpuDigestUnavailable` (a `GraphcheckError`) where NVRTC cannot be
//! loaded or cannot compile the kernel, or the driver cannot load it: the Python layer then
//! digests host copies with the CPU twin, which gives the same digests.

use std::path::PathBuf;

use graphcheck::cuda::digest::{self as gpu, GpuDigestError};
use graphcheck::digest::{DigestText, Located, gc128, gc128_located};
use pyo3::create_exception;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::{GraphcheckError, NativeError, detached};

mod views;

use views::{Place, views_arg};

create_exception!(
    graphcheck,
    GpuDigestUnavailable,
    GraphcheckError,
    "The GPU digest cannot run here: NVRTC (libnvrtc) could not be loaded or could not \
     compile the kernel, or the driver could not load it. Digests of host copies are the \
     same, only slower."
);

/// The `gc128` digest of `data`.
#[pyfunction]
fn gc128_bytes(py: Python<'_>, data: &[u8]) -> PyResult<String> {
    detached(py, move || Ok::<_, NativeError>(gc128(data).0))
}

/// The view's bytes in host memory, from its first element over its span.
///
/// The caller (Python, holding the tensors) promises that each view's span is readable host
/// memory that nothing writes until the call returns: PyTorch hands out CPU storages by
/// address, and no Rust code can check an address.
// Allowed: the one place host memory is read by an address Python hands over.
#[allow(unsafe_code)]
fn host_digest(index: usize, view: &Located) -> Result<DigestText, String> {
    let span = view.span().map_err(|e| format!("view {index}: {e}"))?;
    let memory: &[u8] = if span == 0 {
        &[]
    } else if view.addr == 0 {
        return Err(format!("view {index}: a null address for {span} bytes"));
    } else {
        let len = usize::try_from(span).map_err(|_| format!("view {index}: too large"))?;
        // SAFETY: the caller's promise above: `len` bytes from `addr` are readable and not
        // written during the call; bytes need no alignment.
        unsafe { std::slice::from_raw_parts(view.addr as usize as *const u8, len) }
    };
    gc128_located(memory, view).map_err(|e| format!("view {index}: {e}"))
}

/// The `gc128` digests of views of CPU tensors, read where they are: a `TensorViews` of
/// host memory, or `(address, sizes, strides, element size)` tuples.
#[pyfunction]
fn digest_host<'py>(py: Python<'py>, views: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
    let views = views_arg(views, Place::Host)?;
    let views: &[Located] = &views;
    let texts = detached(py, move || {
        views
            .iter()
            .enumerate()
            .map(|(i, v)| host_digest(i, v))
            .collect::<Result<Vec<_>, _>>()
    })?;
    texts_list(py, &texts)
}

/// Digests as a list of `str`, made from their text directly.
fn texts_list<'py>(py: Python<'py>, texts: &[DigestText]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, texts.iter().map(|t| PyString::new(py, t.as_str())))
}

/// The `gc128` digests of views of CUDA tensors of device `device` (a `TensorViews` of that
/// device, or tuples), in one kernel launch on `stream`
/// (`torch.cuda.current_stream(device).cuda_stream`), waited for. `nvrtc` is libnvrtc's
/// path where the caller found one (else it is looked up by name).
#[pyfunction]
#[pyo3(signature = (device, stream, views, nvrtc=None))]
fn digest_cuda<'py>(
    py: Python<'py>,
    device: i32,
    stream: u64,
    views: &Bound<'py, PyAny>,
    nvrtc: Option<PathBuf>,
) -> PyResult<Bound<'py, PyList>> {
    let views = views_arg(views, Place::Cuda(device))?;
    let views: &[Located] = &views;
    let r = py.detach(move || {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            gpu::located_digests(device, stream, views, nvrtc.as_deref())
        }))
    });
    match r {
        Ok(Ok(texts)) => texts_list(py, &texts),
        Ok(Err(e @ GpuDigestError::Unavailable(_))) => {
            Err(GpuDigestUnavailable::new_err(e.to_string()))
        }
        Ok(Err(e)) => Err(GraphcheckError::new_err(e.to_string())),
        Err(_) => Err(GraphcheckError::new_err(
            "internal error in graphcheck (a bug; please report it): the GPU digest panicked",
        )),
    }
}

/// The `gc128` digests of device memory ranges `(address, bytes)` of the current CUDA
/// context's device, as `(digests, fallback)`: each digest `None` where any byte of its
/// range is not mapped device memory of that device now (asked of the driver first: a read
/// of unmapped memory would poison the context); `fallback` is why the GPU digest was
/// unavailable where the ranges were read through host copies instead (the same digests).
/// Runs on `stream` (`torch.cuda.current_stream().cuda_stream`).
#[pyfunction]
#[pyo3(signature = (ranges, stream, nvrtc=None))]
fn digest_ranges(
    py: Python<'_>,
    ranges: Vec<(u64, u64)>,
    stream: u64,
    nvrtc: Option<PathBuf>,
) -> PyResult<(Vec<Option<String>>, Option<String>)> {
    detached(py, move || -> Result<_, NativeError> {
        graphcheck::cuda::driver::init().map_err(|e| format!("digest_ranges: {e}"))?;
        if !graphcheck::cuda::driver::has_current_context()
            .map_err(|e| format!("digest_ranges: {e}"))?
        {
            return Err(NativeError::Message(
                "digest_ranges: no CUDA context is current on this thread".into(),
            ));
        }
        let (digests, fallback) = gpu::range_digests(&ranges, stream, nvrtc.as_deref())
            .map_err(|e| format!("digest_ranges: {e}"))?;
        Ok((
            digests.into_iter().map(|d| d.map(|d| d.0)).collect(),
            fallback,
        ))
    })
}

/// What the GPU digest has loaded, for diagnostics and the benchmark: `nvrtc_path` and
/// `nvrtc_version` (`None` before NVRTC is loaded), and for `device`'s kernel
/// `scratch_bytes` (device memory it keeps: accumulators and packed views) and
/// `last_kernel_ms` (the kernel's own time in the last call, by events around the launch).
#[pyfunction]
fn gpu_digest_info(py: Python<'_>, device: i32) -> PyResult<Bound<'_, PyDict>> {
    let nvrtc = gpu::loaded_nvrtc();
    let kernel = gpu::loaded_kernel(device);
    let d = PyDict::new(py);
    d.set_item("nvrtc_path", nvrtc.as_ref().map(|n| n.path().to_string()))?;
    d.set_item("nvrtc_version", nvrtc.as_ref().map(|n| n.version()))?;
    d.set_item(
        "scratch_bytes",
        kernel.as_ref().map_or(0, |k| k.scratch_bytes()),
    )?;
    d.set_item(
        "last_kernel_ms",
        kernel
            .as_ref()
            .map_or(0.0, |k| k.last_kernel_seconds() * 1e3),
    )?;
    Ok(d)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add(
        "GpuDigestUnavailable",
        m.py().get_type::<GpuDigestUnavailable>(),
    )?;
    m.add_class::<views::TensorViews>()?;
    m.add_function(wrap_pyfunction!(views::tensor_views, m)?)?;
    m.add_function(wrap_pyfunction!(gc128_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(digest_host, m)?)?;
    m.add_function(wrap_pyfunction!(digest_cuda, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_digest_info, m)?)?;
    m.add_function(wrap_pyfunction!(digest_ranges, m)?)?;
    Ok(())
}
