//! Either document, for the commands that take both.

use super::{DocKind, Live, Manifest, Owner, Pool, Producer, Tensor};

/// Either document, as `diff` and `show` take them.
#[derive(Clone, Debug)]
pub enum Document {
    Manifest(Manifest),
    Live(Live),
}

impl Document {
    pub fn kind(&self) -> DocKind {
        match self {
            Document::Manifest(_) => DocKind::Manifest,
            Document::Live(_) => DocKind::Live,
        }
    }
    pub fn tensors(&self) -> &[Tensor] {
        match self {
            Document::Manifest(m) => &m.tensors,
            Document::Live(l) => &l.tensors,
        }
    }
    pub fn owners(&self) -> &[Owner] {
        match self {
            Document::Manifest(m) => &m.owners,
            Document::Live(l) => &l.owners,
        }
    }
    pub fn pools(&self) -> &[Pool] {
        match self {
            Document::Manifest(m) => &m.pools,
            Document::Live(l) => &l.pools,
        }
    }
    /// The format version the document was read in (and is written in).
    pub fn format_version(&self) -> u32 {
        match self {
            Document::Manifest(m) => m.format_version,
            Document::Live(l) => l.format_version,
        }
    }
    pub fn producer(&self) -> &Producer {
        match self {
            Document::Manifest(m) => &m.producer,
            Document::Live(l) => &l.producer,
        }
    }
}
