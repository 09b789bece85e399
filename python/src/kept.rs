//! The manifest a `build_live` parsed, kept for the `verify` of the same text that follows:
//! the replay check snapshots the live model against the manifest and then verifies the
//! two, and the manifest (megabytes at engine scale) was parsed and checked in each. Kept
//! only where `build_live` is asked to (`keep=True`), one manifest at most, and given up
//! by the next `verify`, whichever text it verifies: a parsed manifest is never held
//! beyond the check that made it.

use std::sync::{Arc, Mutex, Weak};

use graphcheck::codec::load::SharedBytes;
use graphcheck::index::refs::Tables;
use graphcheck::model::format::Manifest;

type Bytes = dyn AsRef<[u8]> + Send + Sync;

/// The text the manifest was parsed from (held weakly: its allocation, and so its
/// address, cannot be another text's while this lives), and the parse.
static KEPT: Mutex<Option<(Weak<Bytes>, Manifest, Tables)>> = Mutex::new(None);

/// Keeps the parse of `text` for the next [`take`].
pub(crate) fn keep(text: &SharedBytes, manifest: Manifest, tables: Tables) {
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    *kept = Some((Arc::downgrade(&text.0), manifest, tables));
}

/// Gives up what is kept; returns it where it is the parse of `text`.
pub(crate) fn take(text: Option<&SharedBytes>) -> Option<(Manifest, Tables)> {
    let kept = KEPT.lock().unwrap_or_else(|e| e.into_inner()).take()?;
    let (of, manifest, tables) = kept;
    let text = text?;
    Weak::ptr_eq(&of, &Arc::downgrade(&text.0)).then_some((manifest, tables))
}

#[cfg(test)]
mod tests {
    use super::*;
    use graphcheck::codec::load::Source;

    fn text(json: &str) -> SharedBytes {
        SharedBytes(Arc::new(json.as_bytes().to_vec()))
    }

    #[test]
    fn a_parse_is_taken_once_by_its_own_text_and_given_up_by_any_other() {
        let json = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/gpu/vllm_cumem_l1_manifest.json"
        ))
        .unwrap();
        let (a, b) = (text(&json), text(&json)); // equal bytes, two texts
        let parse = |t: &SharedBytes| {
            Source::Shared {
                bytes: t.clone(),
                name: "m".into(),
            }
            .manifest_checked()
            .unwrap()
        };
        let (m, t) = parse(&a);
        keep(&a, m.clone(), t);
        assert_eq!(take(Some(&a)).map(|(m, _)| m), Some(m.clone()));
        assert!(take(Some(&a)).is_none(), "taken once");
        let (m, t) = parse(&a);
        keep(&a, m, t);
        assert!(take(Some(&b)).is_none(), "another text's, equal or not");
        assert!(take(Some(&a)).is_none(), "given up by that verify");
        let (m, t) = parse(&a);
        keep(&a, m, t);
        assert!(
            take(None).is_none() && take(Some(&a)).is_none(),
            "a path's verify gives it up"
        );
    }
}
