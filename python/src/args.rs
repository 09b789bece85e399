//! Python arguments into the core's terms: a document (a path, or JSON text: `Text`), a
//! path, and the names of types for messages.

use super::*;

/// A document as the caller handed it. [`Text`] is JSON text; a `str` or `bytes` whose first
/// non-blank characters are `{"` ([`is_json_text`]) is JSON text too; any other `str`,
/// `bytes` or `os.PathLike` is a path, whatever it starts with (`{run}/m.json`), as on the
/// command line. `name` names text in error messages (default `<string>`). Loading is the
/// core's ([`Source`]), the same as the command line's.
pub(crate) fn source(obj: &Bound<'_, PyAny>, name: Option<&str>) -> PyResult<Source> {
    let label = name.unwrap_or("<string>");
    if let Ok(t) = obj.cast::<Text>() {
        let t = t.get();
        return Ok(Source::Shared {
            bytes: t.bytes.clone(),
            name: PathBuf::from(t.name.as_deref().unwrap_or(label)),
        });
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return match s.to_cow() {
            Ok(text) if is_json_text(text.as_bytes()) => Ok(Source::Text {
                bytes: text.as_bytes().to_vec(),
                name: PathBuf::from(label),
            }),
            Ok(text) => Ok(Source::Path(PathBuf::from(text.as_ref()))),
            // Not UTF-8: the string holds a surrogate. JSON text cannot; a path can hold the
            // surrogate escapes of `os.fsdecode` (a file name that is not UTF-8), which the
            // file-system encoding turns back into the name's bytes.
            Err(e) if is_json_text(s.to_string_lossy().as_bytes()) => {
                Err(GraphcheckError::new_err(format!(
                    "{label}: JSON text that is not valid Unicode: {e}"
                )))
            }
            Err(_) => path_arg(obj, label).map(Source::Path),
        };
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        let b = b.as_bytes();
        if is_json_text(b) {
            return Ok(Source::Text {
                bytes: b.to_vec(),
                name: PathBuf::from(label),
            });
        }
        return bytes_path(b, label).map(Source::Path);
    }
    if obj.hasattr("__fspath__").unwrap_or(false) {
        return path_arg(obj, label).map(Source::Path);
    }
    Err(GraphcheckError::new_err(format!(
        "expected a path or JSON text (str, bytes, os.PathLike or Text), got {}",
        type_name(obj)
    )))
}

/// The bytes of a path, as `os.fsencode` gives them: a file name's own bytes.
#[cfg(unix)]
pub(crate) fn bytes_path(b: &[u8], _what: &str) -> PyResult<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    Ok(PathBuf::from(std::ffi::OsStr::from_bytes(b)))
}

/// The bytes of a path, UTF-8 where file names are not bytes.
#[cfg(not(unix))]
pub(crate) fn bytes_path(b: &[u8], what: &str) -> PyResult<PathBuf> {
    std::str::from_utf8(b)
        .map(PathBuf::from)
        .map_err(|e| GraphcheckError::new_err(format!("{what}: a path that is not UTF-8: {e}")))
}

/// Whether a `str` or `bytes` document is JSON text rather than a path: its first
/// characters but JSON's blanks are `{"`, an object's first key, as every document's text
/// begins. A path beginning so names no file any tool writes, while paths beginning with a
/// brace alone are common (`{run}/m.json`, `{}`); other text is handed over as [`Text`].
pub(crate) fn is_json_text(b: &[u8]) -> bool {
    let mut chars = b
        .iter()
        .filter(|c| !matches!(c, b' ' | b'\t' | b'\n' | b'\r'));
    chars.next() == Some(&b'{') && chars.next() == Some(&b'"')
}

/// A document's JSON text, handed over as such (`graphcheck.Text`): never taken for a
/// path, whatever it starts with. Its bytes are shared with each call that reads it, not
/// copied again.
#[pyclass(frozen, module = "graphcheck._native")]
pub(crate) struct Text {
    bytes: SharedBytes,
    name: Option<String>,
    /// The manifest parsed from `bytes`, where a `build_live(keep=True)` kept it (`kept.rs`).
    pub(crate) parsed: crate::kept::ParseCell,
}

#[pymethods]
impl Text {
    /// `text` is a `str` (valid Unicode) or `bytes`; `name` names it in error messages
    /// (default: what the call names its document, `<manifest>`, `<string>`).
    #[new]
    #[pyo3(signature = (text, name=None))]
    fn new(text: &Bound<'_, PyAny>, name: Option<String>) -> PyResult<Text> {
        let bytes = if let Ok(s) = text.cast::<PyString>() {
            s.to_cow()
                .map_err(|e| GraphcheckError::new_err(format!("text is not valid Unicode: {e}")))?
                .as_bytes()
                .to_vec()
        } else if let Ok(b) = text.cast::<PyBytes>() {
            b.as_bytes().to_vec()
        } else {
            return Err(GraphcheckError::new_err(format!(
                "text is a str or bytes (a document's JSON text), not {}",
                type_name(text)
            )));
        };
        Ok(Text {
            bytes: SharedBytes(std::sync::Arc::new(bytes)),
            name,
            parsed: Default::default(),
        })
    }

    /// What error messages call the text, where given.
    #[getter]
    fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Whether a manifest parsed from this text is kept with it (`build_live(keep=True)`),
    /// for the snapshots and verifies of it that follow.
    #[getter]
    fn parsed(&self) -> bool {
        self.parsed.get().is_some()
    }

    /// The text's length in bytes.
    fn __len__(&self) -> usize {
        self.bytes.len()
    }

    fn __repr__(&self) -> String {
        match &self.name {
            Some(n) => format!("<Text {n:?}: {} bytes>", self.bytes.len()),
            None => format!("<Text: {} bytes>", self.bytes.len()),
        }
    }
}

/// A path argument (`str` or `os.PathLike`), encoded as the file system encodes names; a
/// string it cannot encode (a lone surrogate) or any other type is a `GraphcheckError`
/// naming `what`, not the `UnicodeEncodeError` or `TypeError` of the conversion.
pub(crate) fn path_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<PathBuf> {
    obj.extract::<PathBuf>().map_err(|e| {
        let py = obj.py();
        if obj.cast::<PyString>().is_ok() || obj.hasattr("__fspath__").unwrap_or(false) {
            GraphcheckError::new_err(format!(
                "{what}: a path the file system cannot encode: {}",
                e.value(py)
            ))
        } else {
            GraphcheckError::new_err(format!(
                "{what}: expected a path (str or os.PathLike), got {}",
                type_name(obj)
            ))
        }
    })
}

/// The name of `obj`'s type, for messages.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".to_string(), |n| n.to_string())
}
