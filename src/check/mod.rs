//! Checking: the findings a manifest (alone or against a live snapshot) gives, the
//! allowlist that silences some of them, and the diff of two documents.

pub mod allow;
mod context;
pub mod diff;
pub mod finding;
mod live;
mod unowned;
pub mod verify;
