//! graphcheck's core: the manifest format, the address index, the ownership graph, and
//! the verify / explain / show / diff logic over them. No CLI, no Python, no GPU here;
//! the CUDA walker lives behind the `cuda` feature.

pub mod allow;
pub mod build;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod demangle;
pub mod diff;
pub mod exit;
pub mod explain;
pub mod format;
pub mod graph;
pub mod ids;
pub mod index;
pub mod load;
pub mod normalize;
pub mod path;
pub mod report;
#[cfg(test)]
mod testkit;
pub mod text;
pub mod verify;
