//! The document: the versioned on-disk format of manifests and live snapshots, its loader
//! and schema, whether a live snapshot belongs with a manifest (pair), owner paths, and the
//! indexes built over a loaded document (ids, addresses, the ownership graph).

pub mod format;
pub mod ids;
pub mod index;
pub mod load;
pub mod owner_path;
pub mod ownership;
pub mod pair;
pub mod schema;
