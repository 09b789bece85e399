//! graphcheck-gen: writes the synthetic fixture corpus (`fixtures/`), the large benchmark
//! documents and the command line's reference and man pages (`docs/`), and times verify's
//! phases over them. The documents are modelled, not recorded: a small model of
//! PyTorch's caching allocator places tensors, a one-layer vLLM-style decoder launches the
//! kernels a decode step does, and each scenario changes the state the way its upstream
//! reload or sleep bug does. GPU-recorded fixtures are made elsewhere.

pub mod bad;
pub mod bench;
pub mod doc;
pub mod docs;
pub mod fixtures;
pub mod heap;
pub mod index;
pub mod model;
pub mod phases;
pub mod scenarios;
