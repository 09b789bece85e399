//! The views the digest functions read, from the three forms Python hands over: tensors
//! (their attributes read here, a call for all of them), a registry's metadata tuples, and
//! `(address, sizes, strides, element size)` tuples. A call may carry 100,000 views, so
//! nothing here builds a Python object per view, and a contiguous view allocates nothing.

use std::borrow::Cow;

use graphcheck::digest::{Located, View};
use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use crate::GraphcheckError;

/// Where a view's bytes are read: in place in host memory, by the kernel on a CUDA device
/// (its ordinal), or through a host copy (any other device).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    Host,
    Cuda(i32),
    Copy,
}

impl Place {
    /// As Python names it: `None`, the ordinal, or `"copy"`.
    fn to_py<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(match self {
            Place::Host => py.None().into_bound(py),
            Place::Cuda(d) => d.into_pyobject(py)?.into_any(),
            Place::Copy => intern!(py, "copy").clone().into_any(),
        })
    }

    fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Place> {
        if obj.is_none() {
            return Ok(Place::Host);
        }
        if let Ok(s) = obj.cast::<PyString>()
            && s.to_cow()? == "copy"
        {
            return Ok(Place::Copy);
        }
        obj.extract::<i32>().map(Place::Cuda).map_err(|_| {
            GraphcheckError::new_err(format!(
                "device is None (host), a CUDA ordinal or \"copy\", not {obj}"
            ))
        })
    }

    /// Where a registry's device name (`cpu`, `cuda:0`) is read.
    fn of_name(name: &str) -> Place {
        match name {
            "cpu" => Place::Host,
            _ => match name.strip_prefix("cuda:") {
                Some(d) if !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()) => {
                    d.parse().map_or(Place::Copy, Place::Cuda)
                }
                _ => Place::Copy,
            },
        }
    }
}

/// Views of tensors, read on the native side: where each one's bytes are read and where
/// they lie. Views of a [`Place::Copy`] device are not read (their bytes come from host
/// copies) and no digest function takes them.
#[pyclass(frozen, module = "graphcheck._native")]
pub(crate) struct TensorViews {
    pub(crate) places: Vec<Place>,
    /// Per view; `Located::contiguous(0, 0)` for those of `Place::Copy`, which are not read.
    pub(crate) views: Vec<Located>,
}

#[pymethods]
impl TensorViews {
    fn __len__(&self) -> usize {
        self.views.len()
    }

    /// Where the views' bytes are read, each place once, in the order of first appearance:
    /// `None` (host memory), a CUDA ordinal, `"copy"` (through host copies).
    fn devices<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let mut seen: Vec<Place> = Vec::new();
        let mut last = None;
        for &p in &self.places {
            // Runs of one place are the common case: one comparison per view.
            if last != Some(p) && !seen.contains(&p) {
                seen.push(p);
            }
            last = Some(p);
        }
        seen.into_iter().map(|p| p.to_py(py)).collect()
    }

    /// The views of one place (as `devices` names it) and their positions here.
    fn select(&self, device: &Bound<'_, PyAny>) -> PyResult<(TensorViews, Vec<usize>)> {
        let place = Place::from_py(device)?;
        let mut part = TensorViews {
            places: Vec::new(),
            views: Vec::new(),
        };
        let mut positions = Vec::new();
        for (i, (&p, v)) in self.places.iter().zip(&self.views).enumerate() {
            if p == place {
                part.places.push(p);
                part.views.push(v.clone());
                positions.push(i);
            }
        }
        Ok((part, positions))
    }

    /// The views of a registry walk's metadata tuples (storage base, storage bytes, byte
    /// offset, byte span, sizes, strides, dtype, element size, device name), read without
    /// touching a tensor.
    #[staticmethod]
    fn from_metas(metas: &Bound<'_, PyAny>) -> PyResult<TensorViews> {
        crate::catch_panic(|| views_of_metas(metas), crate::InternalError::new_err)
    }
}

/// What [`tensor_views`] returns: the views, or the position of a tensor it cannot read.
#[derive(IntoPyObject)]
pub(crate) enum ViewsOrBad {
    Views(TensorViews),
    Bad(usize),
}

/// The views of `tensors` (a list), or the position of the first item that is not a
/// strided tensor with data (not a `torch.Tensor`, another layout, nested, or meta), for
/// the caller to name it. `torch` is the torch module (its `Tensor` and `strided`).
#[pyfunction]
pub(crate) fn tensor_views(
    tensors: &Bound<'_, PyList>,
    torch: &Bound<'_, PyAny>,
) -> PyResult<ViewsOrBad> {
    crate::catch_panic(
        || read_tensors(tensors, torch),
        crate::InternalError::new_err,
    )
}

/// The names of the attributes read, interned once per call.
struct Names<'py> {
    layout: Bound<'py, PyString>,
    is_nested: Bound<'py, PyString>,
    is_cuda: Bound<'py, PyString>,
    is_cpu: Bound<'py, PyString>,
    is_meta: Bound<'py, PyString>,
    get_device: Bound<'py, PyString>,
    data_ptr: Bound<'py, PyString>,
    is_contiguous: Bound<'py, PyString>,
    nbytes: Bound<'py, PyString>,
}

fn read_tensors(tensors: &Bound<'_, PyList>, torch: &Bound<'_, PyAny>) -> PyResult<ViewsOrBad> {
    let py = tensors.py();
    let tensor_type = torch.getattr(intern!(py, "Tensor"))?;
    let strided = torch.getattr(intern!(py, "strided"))?;
    let names = Names {
        layout: intern!(py, "layout").clone(),
        is_nested: intern!(py, "is_nested").clone(),
        is_cuda: intern!(py, "is_cuda").clone(),
        is_cpu: intern!(py, "is_cpu").clone(),
        is_meta: intern!(py, "is_meta").clone(),
        get_device: intern!(py, "get_device").clone(),
        data_ptr: intern!(py, "data_ptr").clone(),
        is_contiguous: intern!(py, "is_contiguous").clone(),
        nbytes: intern!(py, "nbytes").clone(),
    };
    let mut out = TensorViews {
        places: Vec::with_capacity(tensors.len()),
        views: Vec::with_capacity(tensors.len()),
    };
    let mut dims = Dims::default();
    for (i, t) in tensors.iter().enumerate() {
        // The checks of `_tensors.view_arg`, in its order.
        if !t.is_instance(&tensor_type)?
            || !t.getattr(&names.layout)?.is(&strided)
            || t.getattr(&names.is_nested)?.is_truthy()?
        {
            return Ok(ViewsOrBad::Bad(i));
        }
        // Where its bytes are read: the GPU kernel reads CUDA tensors, the CPU twin host
        // memory in place, and any other device's bytes are copied to the host first.
        let place = if t.getattr(&names.is_cuda)?.is_truthy()? {
            Place::Cuda(t.call_method0(&names.get_device)?.extract()?)
        } else if t.getattr(&names.is_cpu)?.is_truthy()? {
            Place::Host
        } else if t.getattr(&names.is_meta)?.is_truthy()? {
            return Ok(ViewsOrBad::Bad(i));
        } else {
            out.places.push(Place::Copy);
            out.views.push(Located::contiguous(0, 0));
            continue;
        };
        let addr: u64 = t.call_method0(&names.data_ptr)?.extract()?;
        // torch's contiguity is the digest's: row-major, size-1 dimensions aside.
        let view = if t.call_method0(&names.is_contiguous)?.is_truthy()? {
            Located::contiguous(addr, t.getattr(&names.nbytes)?.extract()?)
        } else {
            let itemsize: u32 = t.call_method0(intern!(py, "element_size"))?.extract()?;
            dims.read(
                &t.getattr(intern!(py, "shape"))?,
                &t.call_method0(intern!(py, "stride"))?,
            )?;
            dims.locate(addr, itemsize)
                .map_err(|e| GraphcheckError::new_err(format!("tensors[{i}]: {e}")))?
        };
        out.places.push(place);
        out.views.push(view);
    }
    Ok(ViewsOrBad::Views(out))
}

fn views_of_metas(metas: &Bound<'_, PyAny>) -> PyResult<TensorViews> {
    let metas = metas
        .cast::<PyList>()
        .map_err(|_| PyTypeError::new_err("metas is a list of a registry's metadata tuples"))?;
    let mut out = TensorViews {
        places: Vec::with_capacity(metas.len()),
        views: Vec::with_capacity(metas.len()),
    };
    let mut dims = Dims::default();
    for (i, m) in metas.iter().enumerate() {
        let bad = || PyTypeError::new_err(format!("metas[{i}] is not a registry's metadata tuple"));
        let m = m.cast::<PyTuple>().map_err(|_| bad())?;
        if m.len() != 9 {
            return Err(bad());
        }
        let place = Place::of_name(
            &m.get_item(8)?
                .cast::<PyString>()
                .map_err(|_| bad())?
                .to_cow()?,
        );
        if place == Place::Copy {
            out.places.push(place);
            out.views.push(Located::contiguous(0, 0));
            continue;
        }
        let base: u64 = m.get_item(0)?.extract()?;
        let offset: u64 = m.get_item(2)?.extract()?;
        dims.read(&m.get_item(4)?, &m.get_item(5)?)?;
        let view = dims
            .locate(base.wrapping_add(offset), m.get_item(7)?.extract()?)
            .map_err(|e| GraphcheckError::new_err(format!("metas[{i}]: {e}")))?;
        out.places.push(place);
        out.views.push(view);
    }
    Ok(out)
}

/// Sizes and strides, read into buffers kept across the views of a call.
#[derive(Default)]
struct Dims {
    shape: Vec<u64>,
    stride: Vec<i64>,
}

impl Dims {
    fn read(&mut self, shape: &Bound<'_, PyAny>, stride: &Bound<'_, PyAny>) -> PyResult<()> {
        ints(shape, &mut self.shape)?;
        ints(stride, &mut self.stride)
    }

    fn locate(&self, addr: u64, itemsize: u32) -> Result<Located, graphcheck::digest::ViewError> {
        Located::of(
            addr,
            View {
                shape: &self.shape,
                stride: &self.stride,
                itemsize,
            },
        )
    }
}

/// The integers of a tuple (`torch.Size` is one), item by item: PyO3's generic sequence
/// extraction costs three times as much; any other sequence the generic way.
fn ints<'py, T>(obj: &Bound<'py, PyAny>, out: &mut Vec<T>) -> PyResult<()>
where
    T: for<'a> FromPyObject<'a, 'py>,
    for<'a> <T as FromPyObject<'a, 'py>>::Error: Into<PyErr>,
{
    out.clear();
    match obj.cast::<PyTuple>() {
        Ok(t) => {
            for x in t.iter() {
                out.push(x.extract::<T>().map_err(Into::into)?);
            }
        }
        Err(_) => *out = obj.extract::<Vec<T>>()?,
    }
    Ok(())
}

/// `(address, sizes, strides in elements, element size)` tuples, located; a layout that
/// cannot be read is an error naming the view's position.
pub(crate) fn views_of_tuples(views: &Bound<'_, PyAny>) -> PyResult<Vec<Located>> {
    let mut dims = Dims::default();
    let mut one = |i: usize, v: Bound<'_, PyAny>| -> PyResult<Located> {
        let shape_error =
            || PyTypeError::new_err("a view is a tuple (address, sizes, strides, element size)");
        let t = v.cast::<PyTuple>().map_err(|_| shape_error())?;
        if t.len() != 4 {
            return Err(shape_error());
        }
        let addr: u64 = t.get_item(0)?.extract()?;
        dims.read(&t.get_item(1)?, &t.get_item(2)?)?;
        dims.locate(addr, t.get_item(3)?.extract()?)
            .map_err(|e| GraphcheckError::new_err(format!("view {i}: {e}")))
    };
    match views.cast::<PyList>() {
        Ok(list) => list.iter().enumerate().map(|(i, v)| one(i, v)).collect(),
        Err(_) => views
            .try_iter()?
            .enumerate()
            .map(|(i, v)| one(i, v?))
            .collect(),
    }
}

/// The views of a digest call: a [`TensorViews`]'s, borrowed (all of `place`, else an
/// error), or tuples, located.
pub(crate) fn views_arg<'a>(
    views: &'a Bound<'_, PyAny>,
    place: Place,
) -> PyResult<Cow<'a, [Located]>> {
    let Ok(tv) = views.cast::<TensorViews>() else {
        return views_of_tuples(views).map(Cow::Owned);
    };
    let tv = tv.get();
    if let Some(i) = tv.places.iter().position(|&p| p != place) {
        let want = match place {
            Place::Host => "host memory".to_string(),
            Place::Cuda(d) => format!("CUDA device {d}"),
            Place::Copy => "a host copy".to_string(),
        };
        return Err(GraphcheckError::new_err(format!(
            "view {i} is not in {want} (select the views of one device first)"
        )));
    }
    Ok(Cow::Borrowed(&tv.views))
}
