//! The sleep allocator: tagged device memory whose physical backing is released at `sleep`
//! and mapped again at the same virtual addresses on `wake`, restored from a host copy or
//! filled with a poison. A product of its own beside the verifier: the state machine
//! ([`SleepAllocator`], over any [`Backend`]) and its CUDA backend ([`CudaVmm`], the
//! driver's virtual-memory calls through `graphcheck-driver`). The Python module
//! `graphcheck._native` exports it to PyTorch (`python/src/sleep.rs`); `docs/sleep.md`
//! describes it beside vLLM's `CuMemAllocator`.

mod allocator;
mod vmm;

pub use allocator::{
    AllocationInfo, Backend, Poison, SleepAllocator, SleepError, SleepReport, Stats, WakeReport,
};
pub use vmm::CudaVmm;
