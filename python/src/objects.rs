//! Values as the Python objects `json.loads` would make of their JSON, built straight from
//! their `Serialize` impls with no JSON text in between: what `load` returns. A 29 MiB
//! manifest in format 1 is 126 MiB of JSON text, which `json.loads` took 13 to 27 s to
//! read back on the 2-core machine.
//!
//! The objects are those of serde_json's data model: maps and structs are `dict`s (keys as
//! serde_json writes them: strings, numbers written as strings), sequences and tuples
//! `list`s, enums externally tagged, `None` for unit and absent options.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasherDefault;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyList, PyString};
use serde::ser::{self, Serialize};

use crate::GraphcheckError;

/// How many objects are made between two checks for Python's signal handlers (Ctrl-C).
const SIGNAL_EVERY: usize = 1 << 16;

/// Strings of a document this long or longer are made once per text: kernel names and
/// owner paths repeat; shorter ones, addresses mostly, rarely do in a document, and looking
/// them up made `load` about 15% slower. A report's kernel references repeat their
/// addresses too: there every string is shared, which made `findings` about 20% faster.
pub(crate) const DOCUMENT_STRINGS: usize = 24;
pub(crate) const REPORT_STRINGS: usize = 0;

/// `value` as Python objects, each string of `share_from` bytes or more made once per
/// text; an error is a `GraphcheckError`, and a `KeyboardInterrupt` raised meanwhile ends
/// the conversion.
pub(crate) fn to_python<'py, T: Serialize + ?Sized>(
    py: Python<'py>,
    value: &T,
    share_from: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let builder = Builder {
        py,
        share_from,
        keys: RefCell::new(HashMap::default()),
        made: Cell::new(0),
        strings: RefCell::new(HashMap::default()),
    };
    value.serialize(&builder).map_err(|Failed(e)| e)
}

/// What builds the objects: the GIL, and the field and variant names made so far (a
/// document names the same few dozen keys millions of times; one string each, as
/// `json.loads` shares them).
struct Builder<'py> {
    py: Python<'py>,
    /// Strings this long or longer are made once per text ([`Builder::strings`]).
    share_from: usize,
    /// By the address and length of the name's text (the same address and length are the
    /// same text): serde's names are constants, and hashing the text of every key would
    /// cost more than the lookup saves.
    keys: RefCell<Names>,
    made: Cell<usize>,
    /// The strings made so far, by their text: a document repeats kernel names and owner
    /// paths thousands of times, and one string each saves making (and holding) the copies.
    strings: RefCell<HashMap<Box<str>, Py<PyString>, BuildHasherDefault<ByText>>>,
}

/// Field and variant names' strings, by the address and length of their text.
type Names = HashMap<(usize, usize), Py<PyString>, BuildHasherDefault<ByAddress>>;

/// A hash of a text, eight bytes at a time (the texts are not chosen by an adversary
/// able to watch this table, and SipHash would cost as much as the string it saves).
#[derive(Default)]
struct ByText(u64);

impl std::hash::Hasher for ByText {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let word = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
}

/// The hash of a text's address and length, spread over the table.
#[derive(Default)]
struct ByAddress(u64);

impl std::hash::Hasher for ByAddress {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (self.0.rotate_left(5) ^ n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl<'py> Builder<'py> {
    /// The one string of a field or variant name.
    fn key(&self, name: &'static str) -> Bound<'py, PyString> {
        self.keys
            .borrow_mut()
            .entry((name.as_ptr() as usize, name.len()))
            .or_insert_with(|| PyString::intern(self.py, name).unbind())
            .bind(self.py)
            .clone()
    }

    /// Counts an object made; every [`SIGNAL_EVERY`], runs Python's signal handlers.
    fn made(&self) -> Result<(), Failed> {
        let n = self.made.get() + 1;
        self.made.set(n);
        if n % SIGNAL_EVERY == 0 {
            self.py.check_signals().map_err(Failed)?;
        }
        Ok(())
    }

    fn object(&self, o: Bound<'py, PyAny>) -> Result<Bound<'py, PyAny>, Failed> {
        self.made()?;
        Ok(o)
    }

    /// `{variant: value}`: an enum variant with data, as serde_json writes it.
    fn tagged(
        &self,
        variant: &'static str,
        value: Bound<'py, PyAny>,
    ) -> Result<Bound<'py, PyAny>, Failed> {
        let d = PyDict::new(self.py);
        d.set_item(self.key(variant), value).map_err(Failed)?;
        self.object(d.into_any())
    }
}

/// A conversion that failed: the Python error (a `GraphcheckError`, or what a signal
/// handler raised).
struct Failed(PyErr);

impl fmt::Debug for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for Failed {}

impl ser::Error for Failed {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Failed(GraphcheckError::new_err(format!(
            "failed to convert the document: {msg}"
        )))
    }
}

type Made<'py> = Result<Bound<'py, PyAny>, Failed>;

impl<'a, 'py> ser::Serializer for &'a Builder<'py> {
    type Ok = Bound<'py, PyAny>;
    type Error = Failed;
    type SerializeSeq = Seq<'a, 'py>;
    type SerializeTuple = Seq<'a, 'py>;
    type SerializeTupleStruct = Seq<'a, 'py>;
    type SerializeTupleVariant = Seq<'a, 'py>;
    type SerializeMap = Map<'a, 'py>;
    type SerializeStruct = Map<'a, 'py>;
    type SerializeStructVariant = Map<'a, 'py>;

    fn serialize_bool(self, v: bool) -> Made<'py> {
        Ok(PyBool::new(self.py, v).to_owned().into_any())
    }
    fn serialize_i8(self, v: i8) -> Made<'py> {
        self.serialize_i64(v.into())
    }
    fn serialize_i16(self, v: i16) -> Made<'py> {
        self.serialize_i64(v.into())
    }
    fn serialize_i32(self, v: i32) -> Made<'py> {
        self.serialize_i64(v.into())
    }
    fn serialize_i64(self, v: i64) -> Made<'py> {
        self.object(
            v.into_pyobject(self.py)
                .map_err(|e| Failed(e.into()))?
                .into_any(),
        )
    }
    fn serialize_i128(self, v: i128) -> Made<'py> {
        self.object(
            v.into_pyobject(self.py)
                .map_err(|e| Failed(e.into()))?
                .into_any(),
        )
    }
    fn serialize_u8(self, v: u8) -> Made<'py> {
        self.serialize_u64(v.into())
    }
    fn serialize_u16(self, v: u16) -> Made<'py> {
        self.serialize_u64(v.into())
    }
    fn serialize_u32(self, v: u32) -> Made<'py> {
        self.serialize_u64(v.into())
    }
    fn serialize_u64(self, v: u64) -> Made<'py> {
        self.object(
            v.into_pyobject(self.py)
                .map_err(|e| Failed(e.into()))?
                .into_any(),
        )
    }
    fn serialize_u128(self, v: u128) -> Made<'py> {
        self.object(
            v.into_pyobject(self.py)
                .map_err(|e| Failed(e.into()))?
                .into_any(),
        )
    }
    fn serialize_f32(self, v: f32) -> Made<'py> {
        self.serialize_f64(v.into())
    }
    fn serialize_f64(self, v: f64) -> Made<'py> {
        // serde_json writes a non-finite number as null.
        if !v.is_finite() {
            return self.serialize_unit();
        }
        self.object(PyFloat::new(self.py, v).into_any())
    }
    fn serialize_char(self, v: char) -> Made<'py> {
        self.serialize_str(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Made<'py> {
        if v.len() < self.share_from {
            return self.object(PyString::new(self.py, v).into_any());
        }
        let mut strings = self.strings.borrow_mut();
        if let Some(s) = strings.get(v) {
            return Ok(s.bind(self.py).clone().into_any());
        }
        let s = PyString::new(self.py, v);
        strings.insert(v.into(), s.clone().unbind());
        drop(strings);
        self.object(s.into_any())
    }
    fn serialize_bytes(self, v: &[u8]) -> Made<'py> {
        // serde_json writes bytes as an array of numbers.
        let items = v
            .iter()
            .map(|b| self.serialize_u8(*b))
            .collect::<Result<Vec<_>, _>>()?;
        self.object(PyList::new(self.py, items).map_err(Failed)?.into_any())
    }
    fn serialize_none(self) -> Made<'py> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Made<'py> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Made<'py> {
        Ok(self.py.None().into_bound(self.py))
    }
    fn serialize_unit_struct(self, _: &'static str) -> Made<'py> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Made<'py> {
        Ok(self.key(variant).into_any())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Made<'py> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Made<'py> {
        let v = value.serialize(self)?;
        self.tagged(variant, v)
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Seq<'a, 'py>, Failed> {
        Ok(Seq {
            builder: self,
            items: Vec::with_capacity(len.unwrap_or(0)),
            variant: None,
        })
    }
    fn serialize_tuple(self, len: usize) -> Result<Seq<'a, 'py>, Failed> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Seq<'a, 'py>, Failed> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Seq<'a, 'py>, Failed> {
        let mut seq = self.serialize_seq(Some(len))?;
        seq.variant = Some(variant);
        Ok(seq)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Map<'a, 'py>, Failed> {
        Ok(Map {
            builder: self,
            dict: PyDict::new(self.py),
            key: None,
            variant: None,
        })
    }
    fn serialize_struct(self, _: &'static str, len: usize) -> Result<Map<'a, 'py>, Failed> {
        self.serialize_map(Some(len))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Map<'a, 'py>, Failed> {
        let mut map = self.serialize_map(Some(len))?;
        map.variant = Some(variant);
        Ok(map)
    }
}

/// A list being built (a sequence, a tuple; under `variant`, a tuple variant's data).
struct Seq<'a, 'py> {
    builder: &'a Builder<'py>,
    items: Vec<Bound<'py, PyAny>>,
    variant: Option<&'static str>,
}

impl<'py> Seq<'_, 'py> {
    fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Failed> {
        self.items.push(value.serialize(self.builder)?);
        Ok(())
    }

    fn done(self) -> Made<'py> {
        let b = self.builder;
        let list = b.object(PyList::new(b.py, self.items).map_err(Failed)?.into_any())?;
        match self.variant {
            Some(v) => b.tagged(v, list),
            None => Ok(list),
        }
    }
}

/// The four sequence traits serde has (a list, a tuple, a tuple struct, a tuple variant's
/// fields): each pushes an element and ends the list.
macro_rules! seq_like {
    ($($trait:ident :: $element:ident),* $(,)?) => {$(
        impl<'py> ser::$trait for Seq<'_, 'py> {
            type Ok = Bound<'py, PyAny>;
            type Error = Failed;
            fn $element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Failed> {
                self.push(value)
            }
            fn end(self) -> Made<'py> {
                self.done()
            }
        }
    )*};
}

seq_like!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field,
);

/// A dict being built (a map, a struct; under `variant`, a struct variant's fields).
struct Map<'a, 'py> {
    builder: &'a Builder<'py>,
    dict: Bound<'py, PyDict>,
    /// A map's key, given before its value.
    key: Option<Bound<'py, PyAny>>,
    variant: Option<&'static str>,
}

impl<'py> Map<'_, 'py> {
    fn put(&mut self, key: Bound<'py, PyAny>, value: Bound<'py, PyAny>) -> Result<(), Failed> {
        self.dict.set_item(key, value).map_err(Failed)
    }

    fn done(self) -> Made<'py> {
        let b = self.builder;
        let dict = b.object(self.dict.into_any())?;
        match self.variant {
            Some(v) => b.tagged(v, dict),
            None => Ok(dict),
        }
    }
}

impl<'py> ser::SerializeMap for Map<'_, 'py> {
    type Ok = Bound<'py, PyAny>;
    type Error = Failed;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Failed> {
        self.key = Some(key.serialize(Key(self.builder))?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Failed> {
        let key = self
            .key
            .take()
            .ok_or_else(|| <Failed as ser::Error>::custom("a map value without its key"))?;
        let value = value.serialize(self.builder)?;
        self.put(key, value)
    }
    fn end(self) -> Made<'py> {
        self.done()
    }
}

impl<'py> ser::SerializeStruct for Map<'_, 'py> {
    type Ok = Bound<'py, PyAny>;
    type Error = Failed;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        value: &T,
    ) -> Result<(), Failed> {
        let value = value.serialize(self.builder)?;
        self.put(self.builder.key(name).into_any(), value)
    }
    fn end(self) -> Made<'py> {
        self.done()
    }
}

impl<'py> ser::SerializeStructVariant for Map<'_, 'py> {
    type Ok = Bound<'py, PyAny>;
    type Error = Failed;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        value: &T,
    ) -> Result<(), Failed> {
        let value = value.serialize(self.builder)?;
        self.put(self.builder.key(name).into_any(), value)
    }
    fn end(self) -> Made<'py> {
        self.done()
    }
}

/// A map's key, as serde_json writes keys: a string, or a number, `bool` or `char` written
/// as a string; anything else is an error, as it is for serde_json.
struct Key<'a, 'py>(&'a Builder<'py>);

impl<'py> Key<'_, 'py> {
    fn text(&self, s: &str) -> Made<'py> {
        ser::Serializer::serialize_str(self.0, s)
    }
}

fn key_must_be_a_string() -> Failed {
    <Failed as ser::Error>::custom("a map key that is not a string")
}

impl<'py> ser::Serializer for Key<'_, 'py> {
    type Ok = Bound<'py, PyAny>;
    type Error = Failed;
    type SerializeSeq = ser::Impossible<Bound<'py, PyAny>, Failed>;
    type SerializeTuple = ser::Impossible<Bound<'py, PyAny>, Failed>;
    type SerializeTupleStruct = ser::Impossible<Bound<'py, PyAny>, Failed>;
    type SerializeTupleVariant = ser::Impossible<Bound<'py, PyAny>, Failed>;
    type SerializeMap = ser::Impossible<Bound<'py, PyAny>, Failed>;
    type SerializeStruct = ser::Impossible<Bound<'py, PyAny>, Failed>;
    type SerializeStructVariant = ser::Impossible<Bound<'py, PyAny>, Failed>;

    fn serialize_bool(self, v: bool) -> Made<'py> {
        self.text(if v { "true" } else { "false" })
    }
    fn serialize_i8(self, v: i8) -> Made<'py> {
        self.text(&v.to_string())
    }
    fn serialize_i16(self, v: i16) -> Made<'py> {
        self.text(&v.to_string())
    }
    fn serialize_i32(self, v: i32) -> Made<'py> {
        self.text(&v.to_string())
    }
    fn serialize_i64(self, v: i64) -> Made<'py> {
        self.text(&v.to_string())
    }
    fn serialize_u8(self, v: u8) -> Made<'py> {
        self.text(&v.to_string())
    }
    fn serialize_u16(self, v: u16) -> Made<'py> {
        self.text(&v.to_string())
    }
    fn serialize_u32(self, v: u32) -> Made<'py> {
        self.text(&v.to_string())
    }
    fn serialize_u64(self, v: u64) -> Made<'py> {
        self.text(&v.to_string())
    }
    fn serialize_f32(self, _: f32) -> Made<'py> {
        Err(key_must_be_a_string())
    }
    fn serialize_f64(self, _: f64) -> Made<'py> {
        Err(key_must_be_a_string())
    }
    fn serialize_char(self, v: char) -> Made<'py> {
        self.text(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Made<'py> {
        self.text(v)
    }
    fn serialize_bytes(self, _: &[u8]) -> Made<'py> {
        Err(key_must_be_a_string())
    }
    fn serialize_none(self) -> Made<'py> {
        Err(key_must_be_a_string())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Made<'py> {
        Err(key_must_be_a_string())
    }
    fn serialize_unit(self) -> Made<'py> {
        Err(key_must_be_a_string())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Made<'py> {
        Err(key_must_be_a_string())
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Made<'py> {
        Ok(self.0.key(variant).into_any())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Made<'py> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Made<'py> {
        Err(key_must_be_a_string())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Failed> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Failed> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, Failed> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Failed> {
        Err(key_must_be_a_string())
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Failed> {
        Err(key_must_be_a_string())
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, Failed> {
        Err(key_must_be_a_string())
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Failed> {
        Err(key_must_be_a_string())
    }
}
