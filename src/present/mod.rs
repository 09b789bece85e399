//! Presenting: verify reports (table, Markdown, JSON), the `show` and `diff` text, explain,
//! and normalization (symbolic addresses) for people and snapshot tests.

pub mod explain;
pub mod fmt;
pub mod normalize;
pub mod plan;
pub mod rank_symbols;
pub mod report;
pub mod text;
