//! Format 2's fixed-length arrays: a node's touches, `[param, offset, addr, tensor,
//! allocation]` each, and its ignored words, `[param, offset, addr, reason]` each, read
//! straight into the model's records, and their schemas.

use schemars::JsonSchema;
use serde::de::{DeserializeSeed, IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::TouchAddr;
use crate::model::format::{Addr, AllocationId, IgnoredReason, IgnoredWord, TensorId, Touch};

/// One node's touches, read straight into the model's records: `[param, offset, addr,
/// tensor, allocation]` each. Until [`ManifestV2::into_model`] resolves them, an `addr`
/// written as an offset holds the offset.
#[derive(Default)]
pub struct TouchList {
    pub touches: Vec<Touch>,
    /// Positions of the touches whose `addr` was written as an address.
    pub absolute: Vec<u32>,
}

/// The fields of a touch array, in order.
pub const TOUCH_FIELDS: [&str; 5] = ["param", "offset", "addr", "tensor", "allocation"];

/// The fields of an ignored word's array, in order.
pub const IGNORED_FIELDS: [&str; 4] = ["param", "offset", "addr", "reason"];

/// One node's ignored words: `[param, offset, addr, reason]` each.
#[derive(Default)]
pub struct IgnoredList(pub Vec<IgnoredWord>);

/// Reads the `i`th element of a fixed-length array, or says that the array is too short.
fn element<'de, A: SeqAccess<'de>, T: Deserialize<'de>>(
    seq: &mut A,
    i: usize,
    what: &'static str,
) -> Result<T, A::Error> {
    seq.next_element()?
        .ok_or_else(|| serde::de::Error::invalid_length(i, &what))
}

/// Refuses elements past the end of a fixed-length array.
fn end<'de, A: SeqAccess<'de>>(mut seq: A, n: usize, what: &'static str) -> Result<(), A::Error> {
    match seq.next_element::<IgnoredAny>()? {
        Some(_) => Err(serde::de::Error::invalid_length(n + 1, &what)),
        None => Ok(()),
    }
}

thread_local! {
    /// The touches of the node being read ([`TouchList`]'s visitor).
    static SCRATCH: std::cell::RefCell<Vec<Touch>> = const { std::cell::RefCell::new(Vec::new()) };
}

const TOUCH: &str = "a touch: [param, offset, addr, tensor, allocation]";
const IGNORED: &str = "an ignored word: [param, offset, addr, reason]";

/// One touch array, read into a [`Touch`] and whether its `addr` is an address.
struct TouchRow;

impl<'de> DeserializeSeed<'de> for TouchRow {
    type Value = (Touch, bool);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(Touch, bool), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for TouchRow {
    type Value = (Touch, bool);
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(TOUCH)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(Touch, bool), A::Error> {
        let param = element(&mut seq, 0, TOUCH)?;
        let offset = element(&mut seq, 1, TOUCH)?;
        let addr: TouchAddr = element(&mut seq, 2, TOUCH)?;
        let tensor = element(&mut seq, 3, TOUCH)?;
        let allocation = element(&mut seq, 4, TOUCH)?;
        end(seq, 5, TOUCH)?;
        let (addr, absolute) = match addr {
            TouchAddr::Offset(o) => (Addr(o), false),
            TouchAddr::At(a) => (a, true),
        };
        let touch = Touch {
            param,
            offset,
            addr,
            tensor,
            allocation,
        };
        Ok((touch, absolute))
    }
}

impl<'de> Deserialize<'de> for TouchList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TouchList;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a node's touches: an array of touch arrays")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TouchList, A::Error> {
                // Gathered in a buffer kept per thread, then copied once at their count: a
                // node's few touches would otherwise grow their vector two or three times,
                // and keep the spare capacity.
                SCRATCH.with_borrow_mut(|scratch| {
                    scratch.clear();
                    let mut absolute = Vec::new();
                    while let Some((touch, at)) = seq.next_element_seed(TouchRow)? {
                        if at {
                            absolute.push(scratch.len() as u32);
                        }
                        scratch.push(touch);
                    }
                    Ok(TouchList {
                        touches: scratch.to_vec(),
                        absolute,
                    })
                })
            }
        }
        d.deserialize_seq(V)
    }
}

/// One ignored word's array.
struct IgnoredRow;

impl<'de> DeserializeSeed<'de> for IgnoredRow {
    type Value = IgnoredWord;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<IgnoredWord, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for IgnoredRow {
    type Value = IgnoredWord;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(IGNORED)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<IgnoredWord, A::Error> {
        let word = IgnoredWord {
            param: element(&mut seq, 0, IGNORED)?,
            offset: element(&mut seq, 1, IGNORED)?,
            addr: element(&mut seq, 2, IGNORED)?,
            reason: element(&mut seq, 3, IGNORED)?,
        };
        end(seq, 4, IGNORED)?;
        Ok(word)
    }
}

impl<'de> Deserialize<'de> for IgnoredList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = IgnoredList;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a node's ignored words: an array of ignored-word arrays")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<IgnoredList, A::Error> {
                let mut words = Vec::new();
                while let Some(w) = seq.next_element_seed(IgnoredRow)? {
                    words.push(w);
                }
                Ok(IgnoredList(words))
            }
        }
        d.deserialize_seq(V)
    }
}

impl JsonSchema for TouchList {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Touches".into()
    }
    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let addr = g.subschema_for::<TouchAddr>();
        let tensor = g.subschema_for::<Option<TensorId>>();
        let allocation = g.subschema_for::<Option<AllocationId>>();
        schemars::json_schema!({
            "description": "A node's touches, each `[param, offset, addr, tensor, allocation]`: the parameter index (kernels) or 0 = destination, 1 = source (memset, memcpy); the byte offset of the word inside that parameter; the address; the tensor view it lies in, or null; the allocation it lies in, or null.",
            "type": "array",
            "items": {
                "type": "array",
                "prefixItems": [
                    {"type": "integer", "format": "uint32", "minimum": 0},
                    {"type": "integer", "format": "uint32", "minimum": 0},
                    addr,
                    tensor,
                    allocation
                ],
                "items": false,
                "minItems": 5
            }
        })
    }
}

impl JsonSchema for IgnoredList {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "IgnoredWords".into()
    }
    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let addr = g.subschema_for::<Addr>();
        let reason = g.subschema_for::<IgnoredReason>();
        schemars::json_schema!({
            "description": "A node's ignored words, each `[param, offset, addr, reason]`: words that looked like addresses but are not touches, and why.",
            "type": "array",
            "items": {
                "type": "array",
                "prefixItems": [
                    {"type": "integer", "format": "uint32", "minimum": 0},
                    {"type": "integer", "format": "uint32", "minimum": 0},
                    addr,
                    reason
                ],
                "items": false,
                "minItems": 4
            }
        })
    }
}
