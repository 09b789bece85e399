//! Native capture for Rust/CUDA programs: capture work on a cudarc stream into a graph,
//! walk it, and build a manifest against a registry of named allocations the caller
//! supplies (its "owners").

use std::sync::Arc;

use cudarc::driver::{CudaGraph, CudaStream, sys};

use super::CudaError;
use super::driver::{DriverError, GraphRef};
use super::walk::{WalkStats, driver_version, walk_graph};
use crate::model::format::{Addr, Manifest, PoolKind, Producer, Registration, SleepPolicy};
use crate::resolve::manifest::{ManifestBuilder, TensorSpec};

/// Captures what `work` enqueues on `stream` into an instantiated graph.
///
/// cudarc's per-slice event tracking records events on other streams, which invalidates a
/// capture (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`), so it is turned off for the
/// stream's context first; nothing else in a capturing program should rely on it.
pub fn capture<F>(stream: &Arc<CudaStream>, work: F) -> Result<CudaGraph, CudaError>
where
    F: FnOnce(&Arc<CudaStream>) -> Result<(), CudaError>,
{
    super::driver::disable_event_tracking(stream.context());
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let worked = work(stream);
    // End the capture whatever happened, so the stream is usable again.
    let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    worked?;
    ended?.ok_or_else(|| {
        DriverError::new("cuStreamEndCapture", 0, "the capture produced no graph").into()
    })
}

/// A named device allocation of the caller's program: the owner of a tensor-like range.
#[derive(Clone, Debug)]
pub struct NamedAllocation {
    /// Owner path, e.g. `model.w1`.
    pub path: String,
    pub base: Addr,
    pub nbytes: u64,
    /// Element type and shape, for the manifest's layout (`uint8`, `[nbytes]` for raw bytes).
    pub dtype: String,
    pub itemsize: u32,
    pub shape: Vec<u64>,
    pub registration: Registration,
    /// `cuda:0`, or `cpu` for pinned host memory that copies read or write.
    pub device: String,
}

impl NamedAllocation {
    /// A contiguous range of `count` elements of `dtype` (of `itemsize` bytes).
    pub fn contiguous(path: &str, base: u64, dtype: &str, itemsize: u32, count: u64) -> Self {
        NamedAllocation {
            path: path.to_string(),
            base: Addr(base),
            nbytes: count * u64::from(itemsize),
            dtype: dtype.to_string(),
            itemsize,
            shape: vec![count],
            registration: Registration::Parameter,
            device: "cuda:0".into(),
        }
    }

    /// The same, in pinned host memory.
    pub fn host(path: &str, base: u64, dtype: &str, itemsize: u32, count: u64) -> Self {
        NamedAllocation {
            device: "cpu".into(),
            ..Self::contiguous(path, base, dtype, itemsize, count)
        }
    }
}

/// Walks each named graph and builds one manifest over the registry.
pub fn manifest_of(
    graphs: &[(&str, &CudaGraph)],
    registry: &[NamedAllocation],
    tool: &str,
) -> Result<(Manifest, Vec<WalkStats>), CudaError> {
    let refs: Vec<(&str, GraphRef<'_>)> = graphs
        .iter()
        .map(|&(name, g)| (name, GraphRef::of(g)))
        .collect();
    manifest_of_graphs(&refs, registry, tool)
}

/// [`manifest_of`] for graphs held any other way (built with the driver's graph calls,
/// captured with `cuStreamBeginCapture` directly).
pub fn manifest_of_graphs(
    graphs: &[(&str, GraphRef<'_>)],
    registry: &[NamedAllocation],
    tool: &str,
) -> Result<(Manifest, Vec<WalkStats>), CudaError> {
    let version = driver_version()?;
    let mut b = ManifestBuilder::new(Producer {
        tool: tool.to_string(),
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        gpu: super::driver::device_name(0).ok(),
        driver_version: u32::try_from(version).ok(),
        framework: Some("cudarc (native capture)".into()),
        rank: 0,
        world_size: 1,
        session: None,
    });
    let default_pool = b.add_pool("default", PoolKind::Default, SleepPolicy::Untouched);
    for a in registry {
        let mut stride = vec![1i64; a.shape.len()];
        for i in (0..a.shape.len().saturating_sub(1)).rev() {
            stride[i] = stride[i + 1] * a.shape[i + 1] as i64;
        }
        let id = b.add_tensor(TensorSpec {
            storage_base: a.base,
            storage_nbytes: a.nbytes,
            offset: 0,
            nbytes: a.nbytes,
            shape: a.shape.clone(),
            stride,
            dtype: a.dtype.clone(),
            itemsize: a.itemsize,
            device: a.device.clone(),
            pool: (a.device != "cpu").then_some(default_pool),
            digest: None,
            alloc_site: Vec::new(),
            storage: None,
            alive: None,
        })?;
        b.add_owner(&a.path, id, a.registration, None)?;
        if let Some((base, size)) = super::driver::address_range(a.base.0)
            .or_else(|| super::driver::pointer_range(a.base.0))
        {
            b.add_allocation(Addr(base), size);
        }
    }
    let mut stats = Vec::new();
    for &(name, graph) in graphs {
        let (walked, s) = walk_graph(graph)?;
        stats.push(s);
        b.add_graph(name, None, walked);
    }
    Ok((b.finish()?, stats))
}
