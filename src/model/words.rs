//! The pool enums in words, as documents spell them (their serde names), for every text
//! that prints them (`show --normalized`, the reads view); a test holds the two equal.

use std::fmt;

use crate::model::format::{PoolKind, SleepPolicy};

impl fmt::Display for PoolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PoolKind::Default => "default",
            PoolKind::Graph => "graph",
            PoolKind::Weights => "weights",
            PoolKind::KvCache => "kv_cache",
            PoolKind::Other => "other",
        })
    }
}

impl fmt::Display for SleepPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SleepPolicy::Untouched => "untouched",
            SleepPolicy::Restored => "restored",
            SleepPolicy::Discarded => "discarded",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_words_are_the_serde_names() {
        use PoolKind::*;
        use SleepPolicy::*;
        for k in [Default, Graph, Weights, KvCache, Other] {
            assert_eq!(serde_json::to_value(k).unwrap(), k.to_string());
        }
        for s in [Untouched, Restored, Discarded] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.to_string());
        }
    }
}
