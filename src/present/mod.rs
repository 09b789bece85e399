//! Presenting: verify reports (table, Markdown, JSON), the `show` and `diff` text, explain,
//! normalization (symbolic addresses) for people and snapshot tests, and the reads view (what
//! each graph reads, address-free) for an engine's own snapshot tests.

pub mod explain;
pub mod fmt;
pub mod normalize;
pub mod plan;
pub mod rank_symbols;
pub mod reads;
pub mod report;
pub mod text;
