//! Indexes over a loaded document: the reference check that builds its lookup tables
//! (`refs`: ids, references, layouts, one probe per address), the address interval index
//! (`address`) and the ownership graph `explain` follows (`ownership`).

pub mod address;
pub mod ownership;
pub mod refs;
