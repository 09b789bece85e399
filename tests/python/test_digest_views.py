"""The views the gc128 digest reads, without a GPU: tensors read on the native side
(``_native.tensor_views``), a registry's metadata (``TensorViews.from_metas``) and the
``(address, sizes, strides, element size)`` tuples of the entry points before them give the
same digests, pinned to what main (0fa2fb0) computed; views are grouped by where their bytes
are read, and a view of one place is never read as another's."""

import pytest

import graphcheck
import graphcheck._digest as _digest
import graphcheck._native as native
import graphcheck._tensors as _tensors
import graphcheck.torch as gt

# gt.digest of each view below, as main computed them (0fa2fb0: a Python tuple per view).
PINNED = {
    "contiguous bytes": "gc128:1aa24a951c41da90a4a96cd16026e634",
    "misaligned start": "gc128:3f7032ae7b5b0bb3d040e012ef615360",
    "bf16 matrix": "gc128:4b81e3f9914ed8eee7780b9ad6fe1ce5",
    "size-1 dimensions": "gc128:a8460f60d7f2bed68988a9798d16eee8",
    "scalar": "gc128:4fe18db68851660a1e24e304fb5a2bc0",
    "empty": "gc128:f507e3d23ed59d2b2adfdbd3f5af067e",
    "parameter": "gc128:630cf1fe1c4bfd6921c353e5ae1582f8",
    "conjugate bit": "gc128:89c738b939b2c604a4a4699ff2314078",
    "transposed": "gc128:93de6d64e092c96cc74bc299d099a7a9",
    "column": "gc128:1c2a80b1c991d384f0ba91a5e1970042",
    "rows of 12 of 16 bytes": "gc128:b66cd5b3e4e5a12c93cffc059eb4c566",
    "permuted 3-d": "gc128:440b6a61e45f949b2c9af9cc319e0954",
    "expanded": "gc128:4dd7bdbf807eee099742bd95979661fa",
    "every other": "gc128:df369fd7e772c078e4a496cdb50f6a7c",
}


def pinned_views(torch, device="cpu"):
    """Contiguous views (torch says so: read as one run of bytes) and strided ones."""
    base = (torch.arange(4096, dtype=torch.int64) * 2654435761 % 251).to(torch.uint8)
    base = base.to(device)
    m = base[: 64 * 32].view(torch.bfloat16).reshape(32, 32)
    f = base.view(torch.float32).reshape(64, 16)
    return {
        "contiguous bytes": base[:1000],
        "misaligned start": base[3:1003],
        "bf16 matrix": m,
        # (1, 3, 1) with strides (16, 1, 1): contiguous, its size-1 strides ignored.
        "size-1 dimensions": f[2:3, 4:7].unsqueeze(2),
        "scalar": f[5, 5],
        "empty": f[:, :0],
        "parameter": torch.nn.Parameter(f[1:3].clone()),
        # The conjugate bit is a flag: the bytes read are the stored ones.
        "conjugate bit": base[:64].view(torch.complex64).conj(),
        "transposed": m.t(),
        "column": m[:, 3],
        "rows of 12 of 16 bytes": f[:, :3],
        "permuted 3-d": f.reshape(4, 16, 16).permute(2, 0, 1),
        "expanded": f[0, :5].expand(7, 5),
        "every other": base[::2],
    }


def test_every_entry_point_gives_mains_digests(torch):
    views = pinned_views(torch)
    names, tensors = list(views), list(views.values())
    assert {n: views[n].is_contiguous() for n in ("transposed", "size-1 dimensions")} == {
        "transposed": False,
        "size-1 dimensions": True,
    }
    want = [PINNED[n] for n in names]
    # digest_all: the tensors read natively.
    assert dict(zip(names, gt.digest_all(tensors))) == dict(zip(names, want))
    assert [gt.digest(t) for t in tensors] == want
    # The entry point before: tuples built in Python.
    assert native.digest_host([_digest._view(t) for t in tensors]) == want
    assert native.digest_host(native.tensor_views(tensors, torch)) == want
    # A registry: from the metadata its walk read.
    model = torch.nn.Module()
    for i, t in enumerate(tensors):
        setattr(model, f"t{i}", t)
    reg = gt.walk(model)
    assert len(reg.tensors) == len(tensors)
    from_metas = native.TensorViews.from_metas([r.meta for r in reg.tensors])
    by_tensor = {id(r.tensor): d for r, d in zip(reg.tensors, native.digest_host(from_metas))}
    assert [by_tensor[id(t)] for t in tensors] == want
    specs = {id(r.tensor): s["digest"] for r, s in zip(reg.tensors, reg.tensor_specs("gc128"))}
    assert [specs[id(t)] for t in tensors] == want


def test_a_hundred_thousand_tiny_tensors_in_one_call(torch):
    g = torch.Generator().manual_seed(3)
    big = torch.randint(0, 256, (8 * 100_000,), dtype=torch.uint8, generator=g)
    small = [big[8 * i : 8 * i + 1 + i % 8] for i in range(100_000)]
    got = gt.digest_all(small)
    assert got == native.digest_host([_digest._view(t) for t in small])
    assert got[:50] == [native.gc128_bytes(bytes(t.numpy())) for t in small[:50]]


def metas(torch, devices):
    """CPU tensors (kept by the caller: the metadata points into them) and their registry
    metadata, each named as on `devices[i]`."""
    tensors = [torch.arange(4 + i, dtype=torch.int16) for i in range(len(devices))]
    out = []
    for t, device in zip(tensors, devices):
        (meta, _, _) = _tensors.meta_and_key(t)
        out.append((*meta[:8], device))
    return tensors, out


def test_views_are_grouped_by_where_their_bytes_are_read(torch):
    names = ["cpu", "cuda:1", "mps:0", "cpu", "cuda:0", "cuda:1", "cuda:", "cuda:+1", "cuda:x"]
    _, m = metas(torch, names)
    views = native.TensorViews.from_metas(m)
    assert len(views) == len(names)
    # As main's _meta_device_key: "cuda:<digits>" is that ordinal, anything else a copy.
    assert views.devices() == [None, 1, "copy", 0]
    part, where = views.select(1)
    assert (len(part), where) == (2, [1, 5])
    assert views.select("copy")[1] == [2, 6, 7, 8]
    assert views.select(None)[1] == [0, 3]
    with pytest.raises(graphcheck.GraphcheckError, match="device is None .* not cpu"):
        views.select("cpu")


def test_a_view_of_one_place_is_never_read_as_another(torch):
    """A CUDA address read as host memory would crash the process: a TensorViews carries
    where its views are, and each digest function takes only its own."""
    tensors, m = metas(torch, ["cpu", "cuda:0"])
    views = native.TensorViews.from_metas(m)
    with pytest.raises(graphcheck.GraphcheckError, match="view 1 is not in host memory"):
        native.digest_host(views)
    host, _ = views.select(None)
    with pytest.raises(graphcheck.GraphcheckError, match="view 0 is not in CUDA device 0"):
        native.digest_cuda(0, 0, host)
    with pytest.raises(graphcheck.GraphcheckError, match="view 0 is not in CUDA device 1"):
        native.digest_cuda(1, 0, views.select(0)[0])
    assert native.digest_host(host) == [gt.digest(tensors[0])]


def test_views_of_several_places_come_back_in_order(torch):
    """_gc128 of a registry's views on several devices: each device's digests go back to
    their positions (a "copy" device's through host copies of the tensors)."""
    names = ["cpu", "mps:0", "cpu", "xla:0", "cpu"]
    tensors, m = metas(torch, names)
    got = _digest.gc128(native.TensorViews.from_metas(m), tensors)
    assert got == [gt.digest(t) for t in tensors]
    assert len(set(got)) == len(got)


def test_bad_metadata_and_views_name_what_is_wrong(torch):
    t = torch.arange(6, dtype=torch.int16)
    (meta, _, _) = _tensors.meta_and_key(t)
    with pytest.raises(TypeError, match=r"metas\[1\] is not a registry's metadata tuple"):
        native.TensorViews.from_metas([meta, meta[:8]])
    bad = (*meta[:5], (1, 1), *meta[6:])
    with pytest.raises(graphcheck.GraphcheckError, match=r"metas\[0\]: the view has 1 sizes"):
        native.TensorViews.from_metas([bad])
    assert native.tensor_views([t, t, "x"], torch) == 2
    assert native.tensor_views([t, torch.empty(2, device="meta")], torch) == 1
