//! The model: the records of manifests and live snapshots as the rest of the core sees
//! them, whatever format a document was read in (format 1 is their serde form), with their
//! ids, owner paths and dtypes. It uses nothing else of the crate.

pub mod dtype;
pub mod format;
pub mod ids;
pub mod owner_path;
pub mod version;
pub mod words;
