//! The sleep allocator inside the wheel: the `malloc`/`free` symbols that
//! `torch.cuda.memory.CUDAPluggableAllocator` loads from this very library, and the
//! Python functions that tag, sleep and wake it (`graphcheck.sleep` wraps them).
//!
//! One allocator per process, made on first use. The tag of an allocation is the calling
//! thread's (`sleep_set_tag`): torch calls `malloc` synchronously on the thread that
//! allocates, so a `with sleep_pool("weights")` on one thread does not tag another's.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use graphcheck_sleep::{CudaVmm, Poison, SleepAllocator, SleepError as CoreError};
use pyo3::create_exception;
use pyo3::prelude::*;

use crate::GraphcheckError;

create_exception!(
    graphcheck,
    SleepError,
    GraphcheckError,
    "A sleep-allocator call that cannot be done in the allocator's state (asleep, unknown \
     tag, …), or a driver failure. The allocator is left as it was, except where the driver \
     fails while releasing memory at sleep: it is then asleep with what was released."
);
create_exception!(
    graphcheck,
    SleepOutOfMemoryError,
    SleepError,
    "The device ran out of memory on wake: what the call mapped was released again and \
     the allocator is still asleep."
);

/// The name torch's `CUDAPluggableAllocator` looks up for allocating.
pub const MALLOC_SYMBOL: &str = "graphcheck_sleep_malloc";
/// The name torch's `CUDAPluggableAllocator` looks up for freeing.
pub const FREE_SYMBOL: &str = "graphcheck_sleep_free";

type Allocator = SleepAllocator<CudaVmm>;

static ALLOCATOR: OnceLock<Result<Mutex<Allocator>, String>> = OnceLock::new();
/// The last error `malloc` or `free` met: they cannot raise, so Python reads it here.
static LAST_ERROR: Mutex<Option<String>> = Mutex::new(None);

thread_local! {
    static TAG: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// The tag of allocations made with no `sleep_pool` active on the thread.
const UNTAGGED: &str = "untagged";

/// Runs an allocator call with the GIL released; a panic inside it becomes an
/// `InternalError` (never `PanicException`, which an engine's `except Exception` does not
/// catch; never a `SleepError`, which says the call was refused in the allocator's state).
fn detached_sleep<T: Send>(py: Python<'_>, f: impl FnOnce() -> T + Send) -> PyResult<T> {
    py.detach(move || caught(|| Ok(f())))
}

/// Runs an allocator call that holds the GIL; a panic inside it becomes an `InternalError`.
fn caught<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    crate::catch_panic(f, crate::InternalError::new_err)
}

fn allocator() -> Result<MutexGuard<'static, Allocator>, String> {
    match ALLOCATOR.get_or_init(|| {
        CudaVmm::new()
            .map(|b| Mutex::new(SleepAllocator::new(b)))
            .map_err(|e| e.to_string())
    }) {
        // A panic inside a call left the lock poisoned. The allocator has no panicking
        // path on its own (the exported functions catch any), so the state is used as is.
        Ok(m) => Ok(m.lock().unwrap_or_else(PoisonError::into_inner)),
        Err(e) => Err(format!("the sleep allocator has no CUDA driver: {e}")),
    }
}

fn remember(e: String) {
    *LAST_ERROR.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
}

/// `void* malloc(size_t size, int device, cudaStream_t stream)`, for torch. Returns null
/// when the allocation fails (torch then raises its out-of-memory error).
// Allowed: the unmangled symbol torch looks up by name.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
pub extern "C" fn graphcheck_sleep_malloc(
    size: usize,
    device: c_int,
    _stream: *mut c_void,
) -> *mut c_void {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let tag = TAG
            .with(|t| t.borrow().clone())
            .unwrap_or_else(|| UNTAGGED.to_owned());
        allocator()?
            .malloc(size as u64, device, &tag)
            .map_err(|e| format!("malloc of {size} bytes under tag {tag:?}: {e}"))
    }));
    match r {
        Ok(Ok(va)) => va as usize as *mut c_void,
        Ok(Err(e)) => {
            remember(e);
            std::ptr::null_mut()
        }
        Err(_) => {
            remember(format!("malloc of {size} bytes panicked"));
            std::ptr::null_mut()
        }
    }
}

/// `void free(void* ptr, size_t size, int device, cudaStream_t stream)`, for torch.
// Allowed: the unmangled symbol torch looks up by name.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
pub extern "C" fn graphcheck_sleep_free(
    ptr: *mut c_void,
    size: usize,
    _device: c_int,
    _stream: *mut c_void,
) {
    let va = ptr as usize as u64;
    let r = catch_unwind(AssertUnwindSafe(|| {
        allocator()?
            .free(va)
            .map_err(|e| format!("free of {size} bytes at {va:#x}: {e}"))
    }));
    match r {
        Ok(Ok(())) => {}
        Ok(Err(e)) => remember(e),
        Err(_) => remember(format!("free at {va:#x} panicked")),
    }
}

fn raise(e: CoreError) -> PyErr {
    match e {
        CoreError::WakeOutOfMemory { .. } => SleepOutOfMemoryError::new_err(e.to_string()),
        e => SleepError::new_err(e.to_string()),
    }
}

/// Sets the calling thread's tag (`None`: untagged); returns the previous one.
#[pyfunction]
fn sleep_set_tag(tag: Option<String>) -> PyResult<Option<String>> {
    caught(|| {
        if let Some(t) = &tag
            && t.is_empty()
        {
            return Err(SleepError::new_err("a tag is a non-empty string"));
        }
        Ok(TAG.with(|cell| std::mem::replace(&mut *cell.borrow_mut(), tag)))
    })
}

/// The calling thread's tag.
#[pyfunction]
fn sleep_tag() -> PyResult<Option<String>> {
    caught(|| Ok(TAG.with(|t| t.borrow().clone())))
}

/// Sleeps (see `graphcheck_sleep::SleepAllocator::sleep`); returns what it did.
#[pyfunction]
fn sleep_sleep(
    py: Python<'_>,
    level: u8,
    offload_tags: Vec<String>,
) -> PyResult<BTreeMap<&'static str, u64>> {
    let r = detached_sleep(py, || {
        allocator().map(|mut a| a.sleep(level, &offload_tags))
    })?;
    let r = r.map_err(SleepError::new_err)?.map_err(raise)?;
    Ok(BTreeMap::from([
        ("level", r.level as u64),
        ("offloaded_bytes", r.offloaded_bytes),
        ("discarded_bytes", r.discarded_bytes),
    ]))
}

/// Wakes the allocations of `tags` (all where `None`), filling discarded memory with
/// `poison` (`nan`, `zeros`, `none` or a byte); returns what it did.
#[pyfunction]
#[pyo3(signature = (tags, poison))]
fn sleep_wake(
    py: Python<'_>,
    tags: Option<Vec<String>>,
    poison: &str,
) -> PyResult<BTreeMap<&'static str, u64>> {
    let poison = Poison::parse(poison).map_err(SleepError::new_err)?;
    let r = detached_sleep(py, || {
        allocator().map(|mut a| a.wake(tags.as_deref(), poison))
    })?;
    let r = r.map_err(SleepError::new_err)?.map_err(raise)?;
    Ok(BTreeMap::from([
        ("restored_bytes", r.restored_bytes),
        ("poisoned_bytes", r.poisoned_bytes),
        ("awake", r.awake as u64),
    ]))
}

/// The sleep level, or `None` when awake.
#[pyfunction]
fn sleep_level() -> PyResult<Option<u8>> {
    caught(|| Ok(allocator().map_err(SleepError::new_err)?.asleep()))
}

/// Every tag an allocation was made under.
#[pyfunction]
fn sleep_tags() -> PyResult<Vec<String>> {
    caught(|| Ok(allocator().map_err(SleepError::new_err)?.tags()))
}

/// One allocation for Python: `(base, size, requested, device, tag, state)`.
type AllocationRow = (u64, u64, u64, i32, String, &'static str);

/// Every live allocation: `(base, size, requested, device, tag, state)`.
#[pyfunction]
fn sleep_allocations() -> PyResult<Vec<AllocationRow>> {
    caught(|| {
        let a = allocator().map_err(SleepError::new_err)?;
        Ok(a.allocations()
            .into_iter()
            .map(|i| (i.base, i.size, i.requested, i.device, i.tag, i.state))
            .collect())
    })
}

/// The allocator's counters.
#[pyfunction]
fn sleep_stats() -> PyResult<BTreeMap<&'static str, u64>> {
    caught(|| {
        let s = allocator().map_err(SleepError::new_err)?.stats();
        Ok(BTreeMap::from([
            ("mallocs", s.mallocs),
            ("frees", s.frees),
            ("freed_while_asleep", s.freed_while_asleep),
            ("allocations", s.allocations),
            ("bytes_reserved", s.bytes_reserved),
            ("bytes_mapped", s.bytes_mapped),
            ("host_bytes_held", s.host_bytes_held),
            ("host_bytes_cached", s.host_bytes_cached),
            ("sleeps", s.sleeps),
            ("wakes", s.wakes),
        ]))
    })
}

/// Takes the last error `malloc`/`free` met (they cannot raise), if any.
#[pyfunction]
fn sleep_take_error() -> PyResult<Option<String>> {
    caught(|| {
        Ok(LAST_ERROR
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take())
    })
}

/// Frees the pinned host buffers kept for the next sleep; returns the bytes freed.
#[pyfunction]
fn sleep_release_host_cache(py: Python<'_>) -> PyResult<u64> {
    detached_sleep(py, || allocator().map(|mut a| a.release_host_cache()))?
        .map_err(SleepError::new_err)?
        .map_err(raise)
}

/// `cuMemGetInfo` of `device`: `(free, total)` bytes.
#[pyfunction]
fn sleep_mem_info(device: i32) -> PyResult<(u64, u64)> {
    caught(|| {
        allocator()
            .map_err(SleepError::new_err)?
            .backend_mut()
            .mem_info(device)
            .map_err(raise)
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("SleepError", m.py().get_type::<SleepError>())?;
    m.add(
        "SleepOutOfMemoryError",
        m.py().get_type::<SleepOutOfMemoryError>(),
    )?;
    m.add("SLEEP_MALLOC_SYMBOL", MALLOC_SYMBOL)?;
    m.add("SLEEP_FREE_SYMBOL", FREE_SYMBOL)?;
    m.add_function(wrap_pyfunction!(sleep_set_tag, m)?)?;
    m.add_function(wrap_pyfunction!(sleep_tag, m)?)?;
    m.add_function(wrap_pyfunction!(sleep_sleep, m)?)?;
    m.add_function(wrap_pyfunction!(sleep_wake, m)?)?;
    m.add_function(wrap_pyfunction!(sleep_level, m)?)?;
    m.add_function(wrap_pyfunction!(sleep_tags, m)?)?;
    m.add_function(wrap_pyfunction!(sleep_allocations, m)?)?;
    m.add_function(wrap_pyfunction!(sleep_stats, m)?)?;
    m.add_function(wrap_pyfunction!(sleep_take_error, m)?)?;
    m.add_function(wrap_pyfunction!(sleep_release_host_cache, m)?)?;
    m.add_function(wrap_pyfunction!(sleep_mem_info, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_an_allocator_call_is_an_internal_error_not_a_sleep_error() {
        // A SleepError means "refused in the allocator's state": an engine may handle it
        // (wake first, retry). A bug must not read as one.
        Python::initialize();
        Python::attach(|py| {
            let e = caught(|| -> PyResult<()> { panic!("slot out of range") }).unwrap_err();
            assert!(e.is_instance_of::<crate::InternalError>(py), "{e}");
            assert!(!e.is_instance_of::<SleepError>(py), "{e}");
            assert!(e.to_string().contains("slot out of range"), "{e}");
            let e = detached_sleep(py, || -> u32 { panic!("in the driver call") }).unwrap_err();
            assert!(e.is_instance_of::<crate::InternalError>(py), "{e}");
        });
        assert!(matches!(caught(|| Ok(3u8)), Ok(3)));
    }
}
