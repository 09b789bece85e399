//! A manifest's parse, kept with its `Text`: the replay check snapshots the live model
//! against the manifest and then verifies the two, at every transition, and the manifest
//! (megabytes at engine scale, parsed and checked in tens of milliseconds) stays the same
//! text until the next capture. A `build_live(keep=True)` (or `manifest_facts(keep=True)`)
//! of a `Text` keeps the parse it made with that `Text`; later `manifest_facts`,
//! `build_live`, `verify` and `retarget_plan` calls of the same `Text` take it instead of
//! parsing again. It goes with the `Text`: the instrumentation holds one per
//! frozen manifest and lets it go when a capture freezes the next.

use std::sync::{Arc, Mutex};

use graphcheck::index::refs::Tables;
use graphcheck::model::format::Manifest;

/// A manifest parsed and checked, shared.
pub(crate) type Parsed = (Arc<Manifest>, Arc<Tables>);

/// Where a `Text` keeps the parse of its manifest (empty until a `build_live` keeps one).
#[derive(Default)]
pub(crate) struct ParseCell(Mutex<Option<Parsed>>);

impl ParseCell {
    /// The parse kept, if any.
    pub(crate) fn get(&self) -> Option<Parsed> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Keeps `parsed` (the parse of this very text: only its `Text` calls this).
    pub(crate) fn keep(&self, parsed: Parsed) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(parsed);
    }
}

/// The parse kept with `doc` where it is a `Text` that holds one.
pub(crate) fn kept_parse(doc: &pyo3::Bound<'_, pyo3::PyAny>) -> Option<Parsed> {
    doc.cast::<crate::args::Text>()
        .ok()
        .and_then(|t| t.get().parsed.get())
}

#[cfg(test)]
mod tests {
    use super::*;
    use graphcheck::codec::load::{SharedBytes, Source};

    #[test]
    fn a_kept_parse_is_shared_by_every_taker_and_is_the_texts_own() {
        let json = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/gpu/vllm_cumem_l1_manifest.json"
        ))
        .unwrap();
        let source = Source::Shared {
            bytes: SharedBytes(Arc::new(json.into_bytes())),
            name: "m".into(),
        };
        let (m, t) = source.manifest_checked().unwrap();
        let cell = ParseCell::default();
        assert!(cell.get().is_none(), "empty until kept");
        cell.keep((Arc::new(m.clone()), Arc::new(t)));
        let (a, b) = (cell.get().unwrap(), cell.get().unwrap());
        assert!(
            Arc::ptr_eq(&a.0, &b.0),
            "one parse, shared, not copied per taker"
        );
        assert_eq!(*a.0, m);
    }
}
