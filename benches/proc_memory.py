"""Where a process's resident memory is (Linux): RSS split into anonymous and file-backed
pages (``/proc/self/status``), glibc's heap in use (``mallinfo2``: Rust's allocations and
torch's host side go there; Python's small objects are in pymalloc arenas, counted apart by
``sys.getallocatedblocks``), and the mappings holding the most (``/proc/self/smaps``), so
that two processes can be compared mapping by mapping (``engine_scale.py``'s memory
children)."""
import ctypes
import os
import sys


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _heap_mib():
    """glibc's bytes in use (small chunks + mmapped chunks), MiB; None where not glibc."""
    try:
        libc = ctypes.CDLL(None)
        f = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    f.restype = _Mallinfo2
    m = f()
    return (m.uordblks + m.hblkhd) / 2**20


def _status_mib():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(rest.split()[0]) / 1024
    return out


def all_mappings() -> dict:
    """Resident MiB per mapping name (a file's path, ``[heap]``, ``[anon]`` for the nameless)."""
    out: dict = {}
    name = None
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(None, 1)[0]
            if "-" in first and not first.endswith(":"):
                parts = line.split(None, 5)
                name = parts[5].strip() if len(parts) > 5 else "[anon]"
            elif first == "Rss:":
                out[name] = out.get(name, 0.0) + int(line.split()[1]) / 1024
    return out


def sample(top: int = 0) -> dict:
    """The figures of now; ``top``: the largest mappings too (name -> MiB)."""
    out = {**_status_mib(), "heap_in_use": _heap_mib(), "py_blocks": sys.getallocatedblocks()}
    if top:
        maps = all_mappings()
        out["mappings"] = dict(sorted(maps.items(), key=lambda kv: -kv[1])[:top])
    return out


def by_mapping_delta(a: dict, b: dict, top: int = 12) -> dict:
    """The mappings whose resident MiB differ most from ``a``'s to ``b``'s (full maps)."""
    names = set(a) | set(b)
    d = {n: b.get(n, 0.0) - a.get(n, 0.0) for n in names}
    return dict(sorted(d.items(), key=lambda kv: -abs(kv[1]))[:top])


if __name__ == "__main__":
    import json

    print(json.dumps(sample(top=10), indent=1), file=sys.stdout)
    os._exit(0)
