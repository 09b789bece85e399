//! Resolving: what a walker read from captured graphs (raw address words per node) and what
//! the framework knows (tensor views, owners, pools) resolved into a manifest. GPU-free, so
//! CI tests it; the CUDA walker and the Python front both feed it.

pub mod demangle;
pub mod manifest;
pub mod signature;
pub mod walked;

#[cfg(test)]
mod tests;
