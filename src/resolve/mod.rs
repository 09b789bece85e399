//! Resolving: what a walker read from captured graphs (raw address words per node) and what
//! the framework knows (allocator segments, tensor views, owners, pools) resolved into a
//! manifest, and the live model into a live snapshot. GPU-free, so CI tests it; the CUDA
//! walker and the Python front both feed it.

pub mod demangle;
pub mod facts;
pub mod live;
pub mod manifest;
pub mod signature;
pub mod spec;
pub mod walked;

#[cfg(test)]
mod tests;
