//! Format 2's column tables, each declared once: from one field list ([`column_table!`])
//! follow the column struct the reader and the schema see, the conversion of its columns
//! into format 1's records (every column present checked to hold one value per row), and
//! the writer of records as columns. The list must name every field of the record (the
//! conversion builds the record whole), so a field added to the model and not to its
//! table does not compile.

use std::cell::RefCell;

use serde::Serialize;
use serde::ser::{Error as _, SerializeMap, Serializer};

use crate::index::refs::Invalid;

/// Declares a column table. Each field is `req` (a column every row fills: format 1's
/// required field), `opt` (a column of optional values, left out where every row lacks
/// one: format 1's `Option` field) or `list` (a column of lists, left out where every list
/// is empty: format 1's `Vec` field left out where empty); attributes and docs before a
/// field are the column's (its schema description).
macro_rules! column_table {
    (
        $(#[$meta:meta])*
        $table:literal: $Columns:ident of $Record:ident, written by $Writer:ident {
            $( $(#[$fmeta:meta])* $kind:ident $field:ident: $T:ty, )*
        }
    ) => {
        $(#[$meta])*
        pub struct $Columns {
            $( $(#[$fmeta])* pub $field: $crate::codec::columns::column_type!($kind $T), )*
        }

        impl $Columns {
            /// The records, once every column present holds one value per row.
            pub(crate) fn into_records(
                self,
            ) -> Result<Vec<$Record>, $crate::index::refs::Invalid> {
                let n = $crate::codec::columns::rows(
                    $table,
                    &[ $( (stringify!($field), $crate::codec::columns::column_len!($kind self.$field)), )* ],
                )?;
                $( let mut $field = $crate::codec::columns::column_iter!($kind self.$field); )*
                Ok((0..n)
                    .map(|_| $Record {
                        $( $field: $crate::codec::columns::column_next!($kind $field), )*
                    })
                    .collect())
            }
        }

        /// Writes records as this table's columns.
        pub(crate) struct $Writer<'a>(pub(crate) &'a [$Record]);

        impl serde::Serialize for $Writer<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap as _;
                let r = self.0;
                let mut m = s.serialize_map(None)?;
                $( $crate::codec::columns::column_write!($kind m, stringify!($field), r, $field); )*
                m.end()
            }
        }
    };
}
pub(crate) use column_table;

macro_rules! column_type {
    (req $T:ty) => { Vec<$T> };
    (opt $T:ty) => { Option<Vec<Option<$T>>> };
    (list $T:ty) => { Option<Vec<Vec<$T>>> };
}
pub(crate) use column_type;

macro_rules! column_len {
    (req $c:expr) => {
        Some($c.len())
    };
    (opt $c:expr) => {
        $c.as_ref().map(Vec::len)
    };
    (list $c:expr) => {
        $c.as_ref().map(Vec::len)
    };
}
pub(crate) use column_len;

macro_rules! column_iter {
    (req $c:expr) => {
        $c.into_iter()
    };
    (opt $c:expr) => {
        $c.map(Vec::into_iter)
    };
    (list $c:expr) => {
        $c.map(Vec::into_iter)
    };
}
pub(crate) use column_iter;

macro_rules! column_next {
    (req $it:ident) => {
        $it.next().expect("every column holds one value per row")
    };
    (opt $it:ident) => {
        $it.as_mut().and_then(Iterator::next).flatten()
    };
    (list $it:ident) => {
        $it.as_mut().and_then(Iterator::next).unwrap_or_default()
    };
}
pub(crate) use column_next;

macro_rules! column_write {
    (req $m:ident, $key:expr, $r:ident, $field:ident) => {
        $crate::codec::columns::entry(&mut $m, $key, $r, |x| &x.$field)?
    };
    (opt $m:ident, $key:expr, $r:ident, $field:ident) => {
        $crate::codec::columns::optional(&mut $m, $key, $r, |x| x.$field.as_ref())?
    };
    (list $m:ident, $key:expr, $r:ident, $field:ident) => {
        if $r.iter().any(|x| !x.$field.is_empty()) {
            $crate::codec::columns::entry(&mut $m, $key, $r, |x| &x.$field)?
        }
    };
}
pub(crate) use column_write;

/// The rows of a column table: the length of its first column, which every other column
/// present must have.
pub(crate) fn rows(table: &str, columns: &[(&str, Option<usize>)]) -> Result<usize, Invalid> {
    let Some(&(first, Some(n))) = columns.first() else {
        return Ok(0);
    };
    for &(name, len) in &columns[1..] {
        if let Some(len) = len
            && len != n
        {
            return Err(Invalid::at(
                format!("{table}.{name}"),
                format!(
                    "{len} value{}, but `{table}.{first}` has {n}: every column of a table \
                     holds one value per row",
                    if len == 1 { "" } else { "s" }
                ),
            ));
        }
    }
    Ok(n)
}

/// A column: the values an iterator yields, written as one JSON array. Serializing takes
/// the iterator, so a column is written once.
pub(crate) struct Column<I>(RefCell<Option<I>>);

pub(crate) fn column<I: Iterator>(values: I) -> Column<I> {
    Column(RefCell::new(Some(values)))
}

impl<I> Serialize for Column<I>
where
    I: Iterator,
    I::Item: Serialize,
{
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let values = self
            .0
            .borrow_mut()
            .take()
            .ok_or_else(|| S::Error::custom("a column is written once"))?;
        s.collect_seq(values)
    }
}

/// Writes the column `key` of `records`, `f` giving each record's value.
pub(crate) fn entry<'a, M, T: 'a, V: Serialize>(
    map: &mut M,
    key: &str,
    records: impl IntoIterator<Item = &'a T>,
    f: impl Fn(&'a T) -> V,
) -> Result<(), M::Error>
where
    M: SerializeMap,
{
    map.serialize_entry(key, &column(records.into_iter().map(f)))
}

/// Writes the column `key` of an optional field only where some record has a value: a
/// column every record lacks is left out.
pub(crate) fn optional<'a, M, T: 'a, V: Serialize>(
    map: &mut M,
    key: &str,
    records: &'a [T],
    f: impl Fn(&'a T) -> Option<V>,
) -> Result<(), M::Error>
where
    M: SerializeMap,
{
    if records.iter().any(|r| f(r).is_some()) {
        entry(map, key, records, f)?;
    }
    Ok(())
}
