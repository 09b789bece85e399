//! Checking: the findings a manifest (alone or against a live snapshot) gives, the
//! allowlist that silences some of them, whether a live snapshot belongs with a manifest
//! (`pair`), the ranks of a run verified as one, and the diff of two documents.

pub mod allow;
mod context;
pub mod diff;
pub mod finding;
mod live;
pub mod pair;
pub mod ranks;
mod superseded;
mod unowned;
pub mod verify;
