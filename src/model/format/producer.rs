//! The producer block every document opens with.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What wrote the document, and where.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Producer {
    /// The program that wrote the document, e.g. `graphcheck.torch`.
    pub tool: String,
    pub tool_version: String,
    /// The device's name, e.g. `NVIDIA H200`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// `cuDriverGetVersion`, e.g. `13000`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<u32>,
    /// The framework and its version, e.g. `torch 2.11.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework: Option<String>,
    /// Rank of this process among `world_size` (tensor/pipeline parallel); 0 and 1 alone.
    pub rank: u32,
    pub world_size: u32,
    /// Names the producer's run whose storage numbers the document uses (a
    /// `graphcheck.torch` recorder): documents of one session give a storage object one
    /// number in all of them, and a tensor one of them leaves unnumbered is a storage the
    /// producer did not number. Verify compares a manifest's storages with a live
    /// snapshot's by these numbers where both documents name the same session (a new
    /// storage the allocator put in the block of a dead one is another storage, whatever
    /// its address), and by base and size otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}
