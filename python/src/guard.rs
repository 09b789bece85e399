//! The boundary's error handling: work run with the GIL released, interruptible by Ctrl-C
//! where it writes nothing, and every error or panic turned into a `GraphcheckError`.

use super::*;

/// Runs `f` with the GIL released. A panic inside it (a bug in graphcheck) becomes a
/// `GraphcheckError` instead of `pyo3_runtime.PanicException`, which is a `BaseException`
/// that an engine's `except Exception` would not catch: graphcheck never takes down the
/// process it runs in.
pub(crate) fn detached<T, E, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    T: Send,
    E: Into<NativeError>,
    F: FnOnce() -> Result<T, E> + Send,
{
    py.detach(move || guarded(f))
}

/// How often a call waiting for its work wakes to run Python's signal handlers: Ctrl-C
/// raises `KeyboardInterrupt` within about this long.
pub(crate) const SIGNAL_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Runs `f` on a thread of its own while the calling thread, GIL released, wakes every
/// [`SIGNAL_POLL`] to run Python's signal handlers: the `KeyboardInterrupt` of Ctrl-C (or
/// whatever a handler raises) is raised at once, and `f`'s thread is left to finish alone,
/// what it returns dropped there. So `f` reads only what it owns and writes nothing a
/// caller could see afterwards: no file, no stdout, no borrowed CUDA graph or tensor
/// (those calls use [`detached`]). Errors and panics are [`guarded`]'s.
pub(crate) fn interruptible<T, E, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    T: Send + 'static,
    E: Into<NativeError>,
    F: FnOnce() -> Result<T, E> + Send + 'static,
{
    use std::sync::mpsc::{RecvTimeoutError, sync_channel};
    let (done, result) = sync_channel(1);
    // Shared so that the work can still run here when no thread can be had.
    let job = std::sync::Arc::new(std::sync::Mutex::new(Some(f)));
    let theirs = job.clone();
    let spawned = std::thread::Builder::new()
        .name("graphcheck-call".into())
        .spawn(move || {
            let f = theirs.lock().ok().and_then(|mut f| f.take());
            if let Some(f) = f {
                // A caller that stopped waiting has dropped `result`: the value is dropped.
                let _ = done.send(guarded(f));
            }
        });
    if spawned.is_err() {
        let f = job.lock().ok().and_then(|mut f| f.take());
        return match f {
            Some(f) => detached(py, f),
            None => Err(GraphcheckError::new_err(
                "internal error in graphcheck (a bug; please report it): a call's work was lost",
            )),
        };
    }
    let mut result = result;
    loop {
        let (got, back) = py.detach(move || (result.recv_timeout(SIGNAL_POLL), result));
        result = back;
        match got {
            Ok(r) => return r,
            Err(RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(GraphcheckError::new_err(
                    "internal error in graphcheck (a bug; please report it): a call's thread \
                     ended with no result",
                ));
            }
        }
    }
}

/// Runs `f`, turning its error and any panic into a `GraphcheckError`.
pub(crate) fn guarded<T, E, F>(f: F) -> PyResult<T>
where
    E: Into<NativeError>,
    F: FnOnce() -> Result<T, E>,
{
    catch_panic(
        || f().map_err(|e| GraphcheckError::new_err(chain(&e.into()))),
        InternalError::new_err,
    )
}

/// Every error a native call can end in. Errors stay typed until here, the Python
/// boundary, where they become a `GraphcheckError` whose message is the error and its
/// causes on one line.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NativeError {
    #[error(transparent)]
    Load(#[from] graphcheck::codec::load::LoadError),
    #[error(transparent)]
    Allow(#[from] graphcheck::check::allow::AllowError),
    #[error(transparent)]
    Folder(#[from] graphcheck::app::folder::DirError),
    #[error(transparent)]
    Spec(#[from] graphcheck::resolve::spec::SpecError),
    #[error(transparent)]
    Path(#[from] graphcheck::model::owner_path::PathError),
    #[error(transparent)]
    Cuda(#[from] graphcheck::cuda::CudaError),
    #[error("failed to write JSON")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A check of an argument here, or a library that reports parse errors as text (the
    /// TOML allowlist).
    #[error("{0}")]
    Message(String),
}

impl From<String> for NativeError {
    fn from(m: String) -> NativeError {
        NativeError::Message(m)
    }
}

impl From<&str> for NativeError {
    fn from(m: &str) -> NativeError {
        NativeError::Message(m.to_string())
    }
}

impl From<std::convert::Infallible> for NativeError {
    fn from(e: std::convert::Infallible) -> NativeError {
        match e {}
    }
}

/// Runs `f`; a panic inside it becomes the error `on_panic` makes of its message.
pub(crate) fn catch_panic<T>(
    f: impl FnOnce() -> PyResult<T>,
    on_panic: impl FnOnce(String) -> PyErr,
) -> PyResult<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|payload| Err(on_panic(panic_message(payload.as_ref()))))
}

/// What a caught panic says, as the message of the error that replaces it.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".into());
    format!("internal error in graphcheck (a bug; please report it): {what}")
}

/// An error and its causes as one line.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        message.push_str(": ");
        message.push_str(&c.to_string());
        cause = c.source();
    }
    message
}
