"""hpcviewer's tree filters: elide nodes whose name matches a glob pattern.

Three types (seeds/000, "Filtering Tree Nodes"): *self only* removes the matched node and
hands its children to its parent; *descendants only* keeps the node and removes its subtree;
*self and descendants* removes both. The cost of every removed node goes to its nearest kept
ancestor, as that node's own cost, so exclusive values grow exactly as the seed's figures
show while inclusive values of kept nodes do not change. Filtering produces a new
:class:`TreeSource`, so all three views are computed from the filtered tree.

The filter set is global and persistent: ``$XDG_CONFIG_HOME/callpath/filters.json``.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import numpy as np
import numpy.typing as npt

from callpath.analysis.nodes import ViewKind
from callpath.analysis.source import TreeSource
from callpath.errors import CallpathError
from callpath.formats import sidecar
from callpath.model import CCT
from callpath.model.cct import NodeKind
from callpath.model.treeops import nearest_marked

I64 = npt.NDArray[np.int64]

FILTERS_VERSION = 1


class FilterType(Enum):
    SELF_ONLY = "self"
    DESCENDANTS_ONLY = "descendants"
    SELF_AND_DESCENDANTS = "self-and-descendants"

    @classmethod
    def parse(cls, text: str) -> FilterType:
        key = text.strip().lower().replace("_", "-").replace(" ", "-")
        aliases = {"self": cls.SELF_ONLY, "self-only": cls.SELF_ONLY,
                   "descendants": cls.DESCENDANTS_ONLY, "descendants-only": cls.DESCENDANTS_ONLY,
                   "children": cls.DESCENDANTS_ONLY, "children-only": cls.DESCENDANTS_ONLY,
                   "self-and-descendants": cls.SELF_AND_DESCENDANTS,
                   "self-and-children": cls.SELF_AND_DESCENDANTS, "all": cls.SELF_AND_DESCENDANTS}
        if key not in aliases:
            raise CallpathError(f"filter type {text!r}: expected self, descendants or "
                                "self-and-descendants")
        return aliases[key]


@dataclass(frozen=True)
class Filter:
    """A glob pattern (``*``, ``?``, ``[...]``; matched against the whole scope name, case
    sensitive) with a type, enabled or not."""

    pattern: str
    type: FilterType = FilterType.SELF_ONLY
    enabled: bool = True

    def __post_init__(self) -> None:
        if not self.pattern:
            raise CallpathError("filter pattern is empty: expected a glob such as 'MPI_*'")

    @classmethod
    def parse(cls, spec: str) -> Filter:
        """``PATTERN`` or ``PATTERN:TYPE`` (the type after the last colon when it names one)."""
        head, sep, tail = spec.rpartition(":")
        if sep and head:
            try:
                return cls(head, FilterType.parse(tail))
            except CallpathError:
                pass
        return cls(spec)

    def regex(self) -> re.Pattern[str]:
        return re.compile(fnmatch.translate(self.pattern))


def match_nodes(source: TreeSource, filters: Iterable[Filter]
                ) -> dict[FilterType, npt.NDArray[np.bool_]]:
    """For each filter type, a boolean mask of the source-tree nodes some enabled filter of
    that type matches. Names are matched once per distinct name key."""
    from callpath.analysis.topdown import TopDownView  # views depend on sources, not filters

    active = [f for f in filters if f.enabled]
    masks = {t: np.zeros(len(source.cct), dtype=bool) for t in FilterType}
    if not active:
        return masks
    td = TopDownView(source)
    # Procedure names always; statement and loop names (`file.c:12`, `loop at file.c:12`)
    # only for a pattern with a ':', instruction names (`libc.so.6+0x1f00`) only for one with
    # a '+'. Naming every statement of a 10^6-node tree would cost seconds, and a procedure
    # glob such as `MPI_*` cannot match those names anyway.
    kinds = td.nodes.kind
    wanted = np.isin(kinds, (ViewKind.ACTIVATION, ViewKind.INLINED, ViewKind.ENTRY))
    if any(":" in f.pattern for f in active):
        wanted |= np.isin(kinds, (ViewKind.LINE, ViewKind.LOOP))
    if any("+" in f.pattern for f in active):
        wanted |= kinds == ViewKind.INSTRUCTION
    sel = np.nonzero(wanted)[0]
    keys, reps = td.nodes.name_keys(sel)
    names = td.nodes.names(source.exp, reps)
    for t in FilterType:
        rxs = [f.regex() for f in active if f.type == t]
        if not rxs:
            continue
        hit = np.fromiter((any(rx.match(nm) for rx in rxs) for nm in names), dtype=bool,
                          count=len(names))
        masks[t][sel] = hit[keys]
        masks[t][0] = False  # the root is never elided
    return masks


def apply_filters(source: TreeSource, filters: Iterable[Filter]) -> TreeSource:
    """A new source whose tree has the matched nodes elided (see the module docstring)."""
    return elide_masked(source, match_nodes(source, filters))


def lineless_scopes(source: TreeSource) -> npt.NDArray[np.bool_]:
    """The statement and loop scopes of line 0: code of a module without line information
    (``[libtorch_cpu.so]:0``, ``loop at [libtorch_cpu.so]:0``). Each call from such a
    procedure adds one of these rows between it and its callee, and each loop another, so
    a path through a C++ library without debug information is two to four times as deep
    as its frames while those rows name nothing a user can open."""
    cct = source.cct
    mask: npt.NDArray[np.bool_] = (np.isin(cct.kind, (NodeKind.LINE, NodeKind.LOOP))
                                   & (cct.line <= 0))
    if len(mask):
        mask[0] = False
    return mask


def elide_lineless(source: TreeSource) -> TreeSource:
    """``source`` without :func:`lineless_scopes`, as a *self only* filter elides them: the
    callee hangs under the procedure, the row's own cost goes to the procedure."""
    masks = {t: np.zeros(len(source.cct), dtype=bool) for t in FilterType}
    masks[FilterType.SELF_ONLY] = lineless_scopes(source)
    return elide_masked(source, masks)


def elide_masked(source: TreeSource, masks: dict[FilterType, npt.NDArray[np.bool_]]
                 ) -> TreeSource:
    """A new source without the nodes of ``masks`` (one boolean mask per filter type)."""
    cct = source.cct
    n = len(cct)
    if not any(m.any() for m in masks.values()):
        return source
    diff = np.zeros(n + 1, dtype=np.int64)
    ends = cct.subtree_end
    for t, lo_shift in ((FilterType.DESCENDANTS_ONLY, 1), (FilterType.SELF_AND_DESCENDANTS, 0)):
        hits = np.nonzero(masks[t])[0]
        np.add.at(diff, hits + lo_shift, 1)
        np.add.at(diff, ends[hits], -1)
    removed: npt.NDArray[np.bool_] = np.cumsum(diff[:-1]) > 0
    removed |= masks[FilterType.SELF_ONLY]
    removed[0] = False
    kept = ~removed
    new_index = np.cumsum(kept) - 1  # old kept node -> its index in the new tree
    to_old = nearest_marked(cct.parent, kept)  # every old node -> nearest kept ancestor-or-self
    moved_to = new_index[to_old]
    keep_idx = np.nonzero(kept)[0]
    # depth and subtree ranges of the new tree without walking it: a kept node loses one
    # level per removed ancestor, and its new subtree is the kept part of its old one
    cover = np.zeros(n + 1, dtype=np.int64)
    rem = np.nonzero(removed)[0]
    np.add.at(cover, rem, 1)
    np.add.at(cover, ends[rem], -1)
    removed_above = np.cumsum(cover[:-1])
    kept_before = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(kept, out=kept_before[1:])
    old_par = cct.parent[keep_idx]
    new_par = np.where(old_par >= 0, new_index[to_old[np.maximum(old_par, 0)]], -1)
    sub = CCT(
        ctx_id=cct.ctx_id[keep_idx], parent=new_par.astype(np.int64), kind=cct.kind[keep_idx],
        relation=cct.relation[keep_idx], flags=cct.flags[keep_idx],
        function=cct.function[keep_idx], file=cct.file[keep_idx], line=cct.line[keep_idx],
        module=cct.module[keep_idx], offset=cct.offset[keep_idx],
        propagation=cct.propagation[keep_idx], entry_point=cct.entry_point[keep_idx],
        entry_names={int(new_index[k]): v for k, v in cct.entry_names.items()
                     if k < n and kept[k]},
        depth=cct.depth[keep_idx] - removed_above[keep_idx],
        subtree_end=kept_before[ends[keep_idx]],
    )
    return TreeSource(source.exp, sub, source.orig[keep_idx], source.profiles,
                      parent_source=source, moved_to=moved_to.astype(np.int64))


# ---- the persistent, global filter set ----------------------------------------------------

def filters_path() -> Path:
    return sidecar.config_dir() / "filters.json"


def load_filters(path: Path | None = None) -> list[Filter]:
    """The saved filter set; none when the file does not exist yet."""
    p = path or filters_path()
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as e:
        raise CallpathError(f"{p}: cannot read the filter set: {e.strerror}") from None
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("version") != FILTERS_VERSION:
            raise ValueError(f"expected an object with \"version\": {FILTERS_VERSION}")
        out = []
        for i, item in enumerate(doc.get("filters", [])):
            if not isinstance(item, dict) or not isinstance(item.get("pattern"), str):
                raise ValueError(f"filter {i}: expected an object with a \"pattern\" string")
            out.append(Filter(item["pattern"], FilterType.parse(str(item.get("type", "self"))),
                              bool(item.get("enabled", True))))
        return out
    except (ValueError, CallpathError) as e:
        raise CallpathError(f"{p}: not a callpath filter set: {e}") from None


def save_filters(filters: Iterable[Filter], path: Path | None = None) -> Path:
    """Write the filter set atomically (temporary file, then rename)."""
    p = path or filters_path()
    doc = {"version": FILTERS_VERSION, "filters": [
        {"pattern": f.pattern, "type": f.type.value, "enabled": f.enabled} for f in filters]}
    try:
        sidecar.write_atomically(p, json.dumps(doc, indent=2) + "\n")
    except OSError as e:
        raise CallpathError(f"{p}: cannot save the filter set: {e.strerror}") from None
    return p
