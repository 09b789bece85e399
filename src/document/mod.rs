//! The document: the versioned on-disk format of manifests and live snapshots, its loader
//! (which reads records from JSON objects only, as the schema says) and schema, whether a
//! live snapshot belongs with a manifest (pair), owner paths, the indexes built over a
//! loaded document (ids, addresses, the ownership graph), and writing outputs without
//! harming the user's files; and `gc128`, the content digest graphcheck computes itself (the
//! CPU twin of the GPU kernel).

pub mod digest;
pub mod format;
pub mod ids;
pub mod index;
pub mod load;
pub mod objects;
pub mod owner_path;
pub mod ownership;
pub mod pair;
pub mod ranks;
pub mod schema;
mod wording;
pub mod write;
