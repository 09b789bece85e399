//! The document: the versioned on-disk format of manifests and live snapshots (the model
//! and format 1 in `format`, format 2's columns in `v2`, writing either in `encode`), its
//! loader (which reads records from JSON objects only, as the schema says), reference
//! checks (`refs`) and schemas, whether a
//! live snapshot belongs with a manifest (pair), owner paths, the indexes built over a
//! loaded document (ids, addresses, the ownership graph), and writing outputs without
//! harming the user's files; and `gc128`, the content digest graphcheck computes itself (the
//! CPU twin of the GPU kernel).

pub mod digest;
pub mod dtype;
pub mod encode;
pub mod format;
pub mod ids;
pub mod index;
pub mod load;
pub mod objects;
pub mod owner_path;
pub mod ownership;
pub mod pair;
pub mod ranks;
pub mod refs;
pub mod schema;
pub mod v2;
mod wording;
pub mod write;
