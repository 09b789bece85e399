//! graphcheck's core, laid out as its pipeline: the [`document`] (the on-disk contract and
//! its indexes) → [`resolve`] (what a walker read, resolved into a manifest) → [`check`]
//! (findings: verify, allowlists, diff) → [`present`] (reports and text for people), with
//! [`cuda`] (feature `cuda`) the only place that talks to the driver, through the
//! `graphcheck-driver` crate. Arrows go one way: each folder uses only those before it.
//! No CLI, no Python here.

pub mod check;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod document;
pub mod exit;
mod layout;
pub mod present;
pub mod resolve;
#[cfg(test)]
mod testkit;
