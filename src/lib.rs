//! graphcheck's core, laid out as its pipeline: the [`document`] (the on-disk contract and
//! its indexes) → [`resolve`] (what a walker read, resolved into a manifest) → [`check`]
//! (findings: verify, allowlists, diff) → [`present`] (reports and text for people), with
//! [`cuda`] (feature `cuda`) the only place that talks to the driver. Arrows go one way:
//! each folder uses only those before it. No CLI, no Python here.
// Unsafe code is denied everywhere but in the fenced driver layer, `cuda::driver` and
// `cuda::vmm`.
#![deny(unsafe_code)]

pub mod check;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod document;
pub mod exit;
pub mod present;
pub mod resolve;
pub mod sleep;
#[cfg(test)]
mod testkit;
