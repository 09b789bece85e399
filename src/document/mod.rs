//! The document: the versioned on-disk format of manifests and live snapshots, its loader
//! and schema, owner paths, the indexes built over a loaded document (ids, addresses, the
//! ownership graph), and writing outputs without harming the user's files.

pub mod format;
pub mod ids;
pub mod index;
pub mod load;
pub mod owner_path;
pub mod ownership;
pub mod schema;
pub mod write;
