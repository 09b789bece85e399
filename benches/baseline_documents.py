"""The baseline's reading of documents and allowlists (benches/baseline_verify.py): format
2's columns read the way a plain-Python script would, format 1 as it is, and the TOML
allowlist. Split from baseline_verify.py to keep each file short; the two are one script.
"""

import re
import tomllib

KIND_ORDER = (
    "vanished",
    "drifted",
    "freed",
    "reused",
    "reshaped",
    "stale",
    "unregistered",
    "mispooled",
    "unowned",
    "unused_allow",
)
KIND_RANK = {k: i for i, k in enumerate(KIND_ORDER)}


class BadInput(Exception):
    """A document or allowlist this script cannot use."""


def data_ptr(t):
    """Address of a tensor view's first element."""
    return int(t["storage_base"], 16) + t["offset"]


# --- reading format 2 ------------------------------------------------------------------

TABLES = ("allocations", "tensors", "owners", "probes")
TOUCH_FIELDS = ("param", "offset", "addr", "tensor", "allocation")
IGNORED_FIELDS = ("param", "offset", "addr", "reason")


def records(table):
    """A format 2 column table as format 1's records: one dict per row, a field that is
    null (or whose column is absent) left out, as format 1 leaves it out."""
    keys = list(table)
    return [
        {k: v for k, v in zip(keys, row) if v is not None}
        for row in zip(*(table[k] for k in keys))
    ]


class Bases:
    """What a format 2 touch's `addr` counts from: each tensor's first element and each
    allocation's base, by id (the first record of an id)."""

    def __init__(self, doc):
        self.tensor = {}
        for t in doc["tensors"]:
            self.tensor.setdefault(t["id"], data_ptr(t))
        self.allocation = {}
        for a in doc.get("allocations", ()):
            self.allocation.setdefault(a["id"], int(a["base"], 16))

    def addr(self, row):
        """A touch array's address, as an integer."""
        at = row[2]
        if isinstance(at, str):
            return int(at, 16)
        if row[3] is not None:
            return self.tensor[row[3]] + at
        return self.allocation[row[4]] + at


def read(doc):
    """A document as this script works on it: format 1 as it is; format 2 with its column
    tables as records, its nodes left as columns (see `touched_tensors` and `suspect_touches`
    for how touches are read) and a `Bases` for their addresses."""
    if doc.get("format_version") != 2:
        return doc
    out = dict(doc)
    for key in TABLES:
        if key in doc:
            out[key] = records(doc[key])
    out.setdefault("allocations", [])
    if "graphs" in doc:
        out["bases"] = Bases(out)
    return out


def expand(doc):
    """A format 2 document in format 1's layout, whole (every node and touch an object),
    as graphcheck.load() gives it."""
    if doc.get("format_version") != 2:
        return doc
    out = read(doc)
    bases = out.pop("bases", None)
    out["format_version"] = 1
    for t in out.get("tensors", ()):
        if t.get("alloc_site") == []:
            del t["alloc_site"]
    names = doc.get("names", [])
    launches = doc.get("launches", [])
    graphs = []
    for g in doc.get("graphs", ()):
        g = dict(g)
        cols = g.pop("nodes")
        n = len(cols["index"])
        nodes = []
        for i in range(n):
            node = {"index": cols["index"][i], "kind": cols["kind"][i], "name": names[cols["name"][i]]}
            launch = cols.get("launch", [None] * n)[i]
            if launch is not None:
                for key, value in zip(("grid", "block"), launches[launch]):
                    if value is not None:
                        node[key] = value
            for key in ("parent", "opaque"):
                value = cols.get(key, [None] * n)[i]
                if value is not None:
                    node[key] = value
            node["touches"] = [
                {
                    "param": row[0],
                    "offset": row[1],
                    "addr": hex(bases.addr(row)),
                    **({"tensor": row[3]} if row[3] is not None else {}),
                    **({"allocation": row[4]} if row[4] is not None else {}),
                }
                for row in cols.get("touches", [()] * n)[i]
            ]
            ignored = cols.get("ignored", [()] * n)[i]
            if ignored:
                node["ignored"] = [dict(zip(IGNORED_FIELDS, row)) for row in ignored]
            nodes.append(node)
        g["nodes"] = nodes
        graphs.append(g)
    if "graphs" in doc:
        out["graphs"] = graphs
    out.pop("names", None)
    out.pop("launches", None)
    return out


def touched_tensors(manifest):
    """The tensor ids the touches name (None for a touch that names none). The hot loop:
    one pass over every touch, as a comprehension."""
    if manifest.get("format_version") == 2:
        return {
            row[3]
            for graph in manifest["graphs"]
            for node in graph["nodes"].get("touches", ())
            for row in node
        }
    return {
        touch.get("tensor")
        for graph in manifest["graphs"]
        for node in graph["nodes"]
        for touch in node.get("touches", ())
    }


def suspect_touches(manifest, owners_of):
    """(touch, tensor id or None) of the touches naming no tensor, or a tensor without
    owners: `unowned` candidates; in format 2 each made a format 1 touch object."""
    suspects = []
    if manifest.get("format_version") == 2:
        bases = manifest["bases"]
        for graph in manifest["graphs"]:
            for node in graph["nodes"].get("touches", ()):
                for row in node:
                    tid = row[3]
                    if tid is None or tid not in owners_of:
                        touch = {"addr": hex(bases.addr(row))}
                        if row[4] is not None:
                            touch["allocation"] = row[4]
                        suspects.append((touch, tid))
        return suspects
    for graph in manifest["graphs"]:
        for node in graph["nodes"]:
            for touch in node.get("touches", ()):
                tid = touch.get("tensor")
                if tid is None or tid not in owners_of:
                    suspects.append((touch, tid))
    return suspects


# --- allowlist -------------------------------------------------------------------------


def glob_regex(pattern):
    """`*` matches a run without `.`, `**` any run; everything else (brackets too) is literal."""
    parts = []
    for token in re.split(r"(\*\*|\*)", pattern):
        if token == "**":
            parts.append(".*")
        elif token == "*":
            parts.append("[^.]*")
        else:
            parts.append(re.escape(token))
    return re.compile("".join(parts), re.DOTALL)


def load_allowlist(path):
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise BadInput(f"{path}: invalid allowlist: {e}") from None
    entries = []
    for i, e in enumerate(doc.get("allow", [])):
        if "kernel" in e:
            # The benchmark's documents use no kernel entries; refuse rather than differ.
            raise BadInput(f"{path}: allow[{i}]: kernel entries are not implemented by this baseline")
        if not isinstance(e.get("path"), str) or not e["path"]:
            raise BadInput(f"{path}: allow[{i}].path: a non-empty glob is required")
        if not isinstance(e.get("reason"), str) or not e["reason"].strip():
            raise BadInput(f"{path}: allow[{i}].reason: every entry says why it is allowed")
        kinds = e.get("kinds")
        if kinds is not None and (not kinds or any(k not in KIND_RANK for k in kinds)):
            raise BadInput(f"{path}: allow[{i}].kinds: a non-empty list of finding kinds")
        entries.append((e["path"], glob_regex(e["path"]), None if kinds is None else set(kinds)))
    return entries


def apply_allowlist(findings, entries, checked):
    """Splits findings into (reported, allowed), the first matching entry allowing one, and
    reports every entry that allowed nothing although one of its kinds was checked."""
    used = [False] * len(entries)
    reported, allowed = [], []
    for finding in findings:
        kind, _, paths = finding
        for i, (_, regex, kinds) in enumerate(entries):
            if (kinds is None or kind in kinds) and any(regex.fullmatch(p) for p in paths):
                used[i] = True
                allowed.append(finding)
                break
        else:
            reported.append(finding)
    for (glob, _, kinds), was_used in zip(entries, used):
        if not was_used and (kinds is None or any(k in checked for k in kinds)):
            reported.append(("unused_allow", glob, ()))
    return reported, allowed
