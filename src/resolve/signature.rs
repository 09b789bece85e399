//! Kernel-signature rules: what the demangled signature of a kernel says about the words
//! of its parameters — PyTorch's `TensorInfo` and `OffsetCalculator` index slots, the
//! elementwise closure's operand array, the Philox RNG state, NCCL's communicator — so that words which are not
//! addresses a kernel reads through are set aside, with the reason.

use std::collections::HashMap;

use crate::model::format::IgnoredReason;

/// What the kernel signature says about a parameter's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ParamLayout {
    /// Nothing known: every word is a candidate address.
    Opaque,
    /// torch's `at::cuda::detail::TensorInfo`: `data` at offset 0, then `sizes` and
    /// `strides` (indices).
    TensorInfo,
    /// torch's `OffsetCalculator`: dims, divisors and strides, never an address.
    OffsetCalculator,
    /// The closure `gpu_kernel_impl(_nocast)` hands `elementwise_kernel`: an
    /// `OffsetCalculator<N>` first, then the `std::array<char*, N>` of operand pointers.
    ElementwiseClosure,
    /// An array of pointers (`std::array<char*, N>`): every word is an operand.
    PointerArray,
    /// torch's `at::PhiloxCudaState`: `seed_` and `offset_` (offsets 0 and 8) are, under
    /// capture, pointers to the CUDA generator's graph-safe state.
    PhiloxState,
    /// NCCL's `ncclDevKernelArgsStorage<N>` (the one by-value parameter of every
    /// `ncclDevKernel_*`): `ncclDevKernelArgs` first, whose word at offset 0 is `comm`, the
    /// communicator's device state; the work structs after it hold the user buffers.
    NcclArgs,
}

/// Whether a parameter type is torch's `at::PhiloxCudaState` by value. jiterator and other
/// NVRTC-compiled kernels declare the struct without the `at` namespace, and a `const`
/// parameter may keep its qualifier in a demangled name.
pub(crate) fn is_philox_state(t: &str) -> bool {
    let t = t.trim();
    let t = t.strip_suffix(" const").unwrap_or(t);
    let t = t.strip_prefix("const ").unwrap_or(t);
    let t = t.strip_prefix("::").unwrap_or(t);
    t == "at::PhiloxCudaState" || t == "PhiloxCudaState"
}

/// The layout of each parameter of the kernel `name` (demangled), from its signature.
pub(crate) fn param_layouts(name: &str) -> Vec<ParamLayout> {
    crate::resolve::demangle::param_types(name)
        .map(|types| {
            types
                .iter()
                .map(|t| {
                    if t.starts_with("at::cuda::detail::TensorInfo<") {
                        ParamLayout::TensorInfo
                    } else if t.starts_with("OffsetCalculator<")
                        || t.starts_with("at::native::OffsetCalculator<")
                    {
                        ParamLayout::OffsetCalculator
                    } else if t.contains("gpu_kernel_impl") && t.ends_with("::{lambda(int)#1}") {
                        ParamLayout::ElementwiseClosure
                    } else if t.starts_with("std::array<char*,")
                        || t.starts_with("at::detail::Array<char*,")
                    {
                        ParamLayout::PointerArray
                    } else if is_philox_state(t) {
                        ParamLayout::PhiloxState
                    } else if t.starts_with("ncclDevKernelArgsStorage<") {
                        ParamLayout::NcclArgs
                    } else {
                        ParamLayout::Opaque
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `OffsetCalculator<N, uint32_t>` on CUDA: `int dims`, 25 `IntDivider<uint32_t>` (12
/// bytes each), `uint32_t strides[25][N]`, padded to 8 bytes.
pub(crate) fn offset_calculator_size(n: u32) -> u32 {
    (4 + 25 * 12 + 25 * 4 * n).div_ceil(8) * 8
}

/// Where the operand pointers of an elementwise closure start, found from the words
/// themselves: the `N` words at `offset_calculator_size(N)`, `+ 8`, … are all present.
/// Everything before is the calculator. `None` where no `N` fits (a layout we do not know).
pub(crate) fn closure_data_offset(offsets: &[u32]) -> Option<u32> {
    (1..=16)
        .map(offset_calculator_size)
        .zip(1u32..)
        .find_map(|(start, n)| {
            (0..n)
                .all(|i| offsets.contains(&(start + 8 * i)))
                .then_some(start)
        })
}

/// What a node's kernel signature says about each of its words.
pub(crate) struct NodeSignature<'a> {
    layouts: &'a [ParamLayout],
    /// Per elementwise-closure parameter: where its operand pointers start.
    data_start: HashMap<u32, Option<u32>>,
}

/// What the signature makes of one word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WordRole {
    /// Not an address the kernel reads through, for the reason given.
    SetAside(IgnoredReason),
    /// An operand pointer: a touch, whatever the memory it points to holds now.
    Operand,
    /// Nothing known: a touch unless it points into free memory.
    Unknown,
}

impl<'a> NodeSignature<'a> {
    /// `layouts` are the kernel's, from [`param_layouts`]; `words` the node's address
    /// words as `(parameter index, byte offset)`.
    pub(crate) fn new(layouts: &'a [ParamLayout], words: &[(u32, u32)]) -> NodeSignature<'a> {
        // A word past the parameters the signature names: the name was not parsed right,
        // so nothing is known of any parameter.
        let layouts = if words
            .iter()
            .any(|&(param, _)| param as usize >= layouts.len())
        {
            &[]
        } else {
            layouts
        };
        let mut data_start = HashMap::new();
        for (p, l) in layouts.iter().enumerate() {
            if *l == ParamLayout::ElementwiseClosure {
                let offsets: Vec<u32> = words
                    .iter()
                    .filter(|&&(param, _)| param == p as u32)
                    .map(|&(_, offset)| offset)
                    .collect();
                data_start.insert(p as u32, closure_data_offset(&offsets));
            }
        }
        NodeSignature {
            layouts,
            data_start,
        }
    }

    /// What the word at `param`, byte `offset` is.
    pub(crate) fn role(&self, param: u32, offset: u32) -> WordRole {
        let layout = self
            .layouts
            .get(param as usize)
            .copied()
            .unwrap_or(ParamLayout::Opaque);
        match layout {
            ParamLayout::Opaque => WordRole::Unknown,
            ParamLayout::PointerArray => WordRole::Operand,
            ParamLayout::TensorInfo if offset > 0 => WordRole::SetAside(IgnoredReason::IndexSlot),
            ParamLayout::TensorInfo => WordRole::Unknown,
            ParamLayout::OffsetCalculator => WordRole::SetAside(IgnoredReason::IndexSlot),
            ParamLayout::ElementwiseClosure => {
                match self.data_start.get(&param).copied().flatten() {
                    Some(start) if offset < start => WordRole::SetAside(IgnoredReason::IndexSlot),
                    Some(_) => WordRole::Operand,
                    None => WordRole::Unknown,
                }
            }
            ParamLayout::PhiloxState if offset == 0 || offset == 8 => {
                WordRole::SetAside(IgnoredReason::RngState)
            }
            ParamLayout::PhiloxState => WordRole::Unknown,
            ParamLayout::NcclArgs if offset == 0 => WordRole::SetAside(IgnoredReason::NcclComm),
            ParamLayout::NcclArgs => WordRole::Unknown,
        }
    }
}
