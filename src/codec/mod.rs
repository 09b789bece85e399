//! The codecs: reading documents (`load`, which checks every record against the others
//! through [`crate::index::refs`]), format 2's columns (`v2`), writing either format
//! (`encode`), records straight to other object models (`objects`), the JSON Schemas
//! (`schema`) and the wording of parse errors (`wording`). A format 3 would touch this
//! folder alone.

mod columns;
pub mod encode;
pub mod load;
pub mod objects;
pub mod schema;
pub mod v2;
mod wording;
