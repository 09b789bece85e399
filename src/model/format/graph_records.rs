//! Records a graph carries beside its nodes: the static inputs torch guards for it, and
//! the retargets applied to it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Addr;

/// A static input address of a graph and the owner paths that held it at capture.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Guard {
    pub addr: Addr,
    pub paths: Vec<String>,
}

/// One retarget applied to a graph: what it followed (`event`), how many words it changed,
/// and when (seconds since the Unix epoch, where the producer has a clock).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RetargetRecord {
    pub event: String,
    pub edits: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<f64>,
}
