//! graphcheck's core, laid out as its pipeline: the [`model`] (the records of manifests and
//! live snapshots) → [`index`] (reference checks and lookups over a loaded document) and
//! [`codec`] (the on-disk formats, read and written) → [`resolve`] (what a walker read,
//! resolved into a manifest) → [`check`] (findings: verify, allowlists, diff) → [`present`]
//! (reports and text for people) → [`app`] (what each command does, for the command line and
//! the Python API); [`digest`] is the gc128 content digest, and [`cuda`] (feature `cuda`) the
//! only place that talks to the driver, through the `graphcheck-driver` crate. Arrows go one
//! way, as `layout` holds. No clap, no Python here.

pub mod app;
pub mod check;
pub mod codec;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod digest;
pub mod exit;
pub mod index;
mod layout;
pub mod model;
pub mod plan;
pub mod present;
pub mod resolve;
#[cfg(test)]
mod testkit;
