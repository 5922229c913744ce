"""The Flat view: static structure, load module → file → procedure → loops / inlined code →
statements, with call sites shown as procedure activations.

Every source-tree node is mapped to the static scope it belongs to, wherever it occurred:
a procedure frame to its procedure, any other node to (its enclosing flat scope, kind, what it
is). Scopes are numbered one *lexical depth* at a time (distance from the enclosing procedure
frame), because two nodes with the same flat scope always have the same lexical depth; each
level is one lexsort. A scope's exclusive value is the sum over its instances; its inclusive
value sums only the outermost instances on each path (the recursion rule).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from callpath.analysis.nodes import NodeTable, ViewKind
from callpath.analysis.source import TreeSource, call_sites
from callpath.analysis.topdown import View
from callpath.model import Experiment, NodeKind, Relation
from callpath.model.treeops import csr, group_rows, group_sum, nearest_marked, outermost

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


def procedure_keys(function: I64, module: I64, canon: I64) -> I64:
    """One key per procedure: the canonical function id, or for nameless code
    ``-2 - module`` (one "unknown procedure" per load module)."""
    return np.where(function >= 0, canon[np.maximum(function, 0)] if len(canon) else -1,
                    -2 - np.maximum(module, -1))


def canonical_functions(exp: Experiment) -> I64:
    """Map each function id to the first id with the same name, module, file and line.

    hpcprof writes one function entry per inlined copy (loops-cputime-t.d has two identical
    ``test_separated_loops_helper`` entries); a view shows a procedure once."""
    first: dict[tuple[str, int, int, int, bool], int] = {}
    out = np.empty(len(exp.functions), dtype=np.int64)
    for i, f in enumerate(exp.functions):
        out[i] = first.setdefault((f.name, f.module, f.file, f.line, f.has_name), i)
    return out


def procedure_locations(exp: Experiment, function: I64, module: I64, file: I64, line: I64
                        ) -> tuple[I64, I64, I64]:
    """Module, file and line of each node's procedure: from the function table where it says,
    else the node's own fields (a sentinel last row stands for "no function")."""
    fmod = np.array([f.module for f in exp.functions] + [-1], dtype=np.int64)
    ffile = np.array([f.file for f in exp.functions] + [-1], dtype=np.int64)
    fline = np.array([f.line for f in exp.functions] + [0], dtype=np.int64)
    fi = np.where(function >= 0, function, len(exp.functions))
    return (np.where(fmod[fi] >= 0, fmod[fi], module),
            np.where(ffile[fi] >= 0, ffile[fi], file),
            np.where(ffile[fi] >= 0, fline[fi], line))


class FlatView(View):
    name = "flat"

    def __init__(self, source: TreeSource) -> None:
        super().__init__(source)
        exp = source.exp
        cct = source.cct
        n = len(cct)
        kind = source.column("kind")
        rel = source.column("relation")
        function = source.column("function")
        module = source.column("module")
        file = source.column("file")
        line = source.column("line").astype(np.int64)
        offset = source.column("offset")
        parent = cct.parent

        is_fn = kind == NodeKind.FUNCTION
        is_proc = is_fn & (rel != Relation.INLINED_CALL)
        is_top = (kind == NodeKind.ROOT) | (kind == NodeKind.ENTRY)
        anchor = nearest_marked(parent, is_proc | is_top)
        lexdepth = cct.depth - cct.depth[np.maximum(anchor, 0)]

        pmod, pfile, pline = procedure_locations(exp, function, module, file, line)

        cols: dict[str, list[npt.NDArray[np.int64]]] = {
            k: [] for k in ("kind", "function", "module", "file", "line", "offset", "call_line",
                            "parent")}
        count = 0

        def add(kind_: npt.ArrayLike, function_: npt.ArrayLike, module_: npt.ArrayLike,
                file_: npt.ArrayLike, line_: npt.ArrayLike, offset_: npt.ArrayLike,
                call_line_: npt.ArrayLike, parent_: npt.ArrayLike, size: int) -> int:
            nonlocal count
            for key, v in (("kind", kind_), ("function", function_), ("module", module_),
                           ("file", file_), ("line", line_), ("offset", offset_),
                           ("call_line", call_line_), ("parent", parent_)):
                arr = np.asarray(v)
                cols[key].append(np.broadcast_to(arr, (size,)).astype(np.int64, copy=False)
                                 if key != "offset" else
                                 np.broadcast_to(arr, (size,)).astype(np.uint64))
            first = count
            count += size
            return first

        add(ViewKind.ROOT, -1, -1, -1, 0, 0, -1, -1, 1)
        mem_group: list[I64] = [np.zeros(1, np.int64)]
        mem_node: list[I64] = [np.zeros(1, np.int64)]
        # which members count toward inclusive values (the recursion rule); None: decide
        # below, once we know whether any procedure is recursive
        mem_outer: list[npt.NDArray[np.bool_] | None] = [np.ones(1, bool)]
        ends = cct.subtree_end

        # ---- load modules, files, procedures -------------------------------------------
        procs = np.nonzero(is_proc)[0]
        canon = canonical_functions(exp)
        pkey = procedure_keys(function[procs], module[procs], canon)
        proc_id_of_key, proc_first = group_rows(pkey)
        p_rep = procs[proc_first]  # one frame per procedure
        rep_mod = pmod[p_rep]
        rep_file = pfile[p_rep]
        mod_id, mod_first = group_rows(rep_mod)
        m0 = add(ViewKind.MODULE, -1, rep_mod[mod_first], -1, 0, 0, -1, 0, len(mod_first))
        file_id, file_first = group_rows(rep_mod, rep_file)
        f0 = add(ViewKind.FILE, -1, rep_mod[file_first], rep_file[file_first], 0, 0, -1,
                 m0 + mod_id[file_first], len(file_first))
        p0 = add(ViewKind.PROCEDURE, function[p_rep], rep_mod, rep_file, pline[p_rep],
                 offset[p_rep], -1, f0 + file_id, len(p_rep))
        proc_flat = p0 + proc_id_of_key  # flat node of each procedure frame
        mod_flat = m0 + mod_id[proc_id_of_key]
        file_flat = f0 + file_id[proc_id_of_key]
        mem_group += [proc_flat, mod_flat, file_flat]
        mem_node += [procs, procs, procs]
        proc_outer = outermost(proc_flat, procs, ends)
        recursive = not bool(proc_outer.all())
        # a module's procedures call each other: nesting there is the rule, not recursion
        mem_outer += [proc_outer, outermost(mod_flat, procs, ends),
                      outermost(file_flat, procs, ends)]
        # Inlined code also counts toward its module and file: hpcprof stops the exclusive
        # ("function") propagation at inlined calls, so without these a module's exclusive
        # cost would miss the inlined code compiled into it. They never change an
        # inclusive value: each lies inside a frame of the same module, already a member.
        inl = np.nonzero(is_fn & ~is_proc)[0]
        inl = inl[(anchor[inl] >= 0) & is_proc[np.maximum(anchor[inl], 0)]]
        pos = np.full(n, -1, dtype=np.int64)
        pos[procs] = np.arange(len(procs))
        host = pos[anchor[inl]]
        mem_group += [mod_flat[host], file_flat[host]]
        mem_node += [inl, inl]
        mem_outer += [np.zeros(len(inl), bool), np.zeros(len(inl), bool)]

        # ---- lexical scopes and call sites, one lexical depth at a time ------------------
        lex = np.zeros(n, dtype=np.int64)  # the flat scope a node's children nest in
        lex[procs] = proc_flat
        safe_par = np.maximum(parent, 0)
        par_top = is_top[safe_par]
        # a call site: the caller's statement (or loop) it was called from
        site_line = call_sites(kind, file, line, parent)[0]
        proc_key_all = procedure_keys(function, module, canon)
        max_lex = int(lexdepth.max()) if n else 0
        # a 16-bit key makes numpy's stable sort a radix sort
        by_level_order = np.argsort(lexdepth.astype(np.int16) if max_lex < 32000 else lexdepth,
                                    kind="stable")
        bounds = np.searchsorted(lexdepth[by_level_order], np.arange(max_lex + 2))
        calls = procs[(parent[procs] >= 0) & ~par_top[procs]]
        call_level = lexdepth[parent[calls]] + 1
        for level in range(1, max_lex + 2):
            lv = by_level_order[bounds[level]:bounds[level + 1]] if level <= max_lex \
                else np.zeros(0, np.int64)
            lv = lv[~is_proc[lv] & ~is_top[lv]]
            cs = calls[call_level == level]
            if not len(lv) and not len(cs):
                continue
            k = kind[lv]
            tag = np.full(len(lv), ViewKind.LINE, dtype=np.int64)
            tag[k == NodeKind.LOOP] = ViewKind.LOOP
            tag[k == NodeKind.INSTRUCTION] = ViewKind.INSTRUCTION
            tag[k == NodeKind.FUNCTION] = ViewKind.INLINED
            inl = k == NodeKind.FUNCTION
            ins = k == NodeKind.INSTRUCTION
            a = np.where(inl, procedure_keys(function[lv], module[lv], canon),
                         np.where(ins, module[lv], file[lv]))
            b = np.where(inl, site_line[lv],
                         np.where(ins, offset[lv].astype(np.int64), line[lv]))
            rows_par = np.concatenate([lex[parent[lv]], lex[parent[cs]]])
            rows_tag = np.concatenate([tag, np.full(len(cs), ViewKind.ACTIVATION, np.int64)])
            rows_a = np.concatenate([a, proc_key_all[cs]])
            rows_b = np.concatenate([b, site_line[cs]])
            rid, first = group_rows(rows_par, rows_tag, rows_a, rows_b)
            members = np.concatenate([lv, cs])
            rep = members[first]
            rk = rows_tag[first]
            is_site = (rk == ViewKind.ACTIVATION) | (rk == ViewKind.INLINED)
            base = add(rk, function[rep], np.where(is_site, pmod[rep], module[rep]),
                       np.where(is_site, pfile[rep], file[rep]),
                       np.where(is_site, pline[rep], line[rep]), offset[rep],
                       np.where(is_site, site_line[rep], -1), rows_par[first], len(first))
            lex[lv] = base + rid[:len(lv)]
            mem_group.append(base + rid)
            mem_node.append(members)
            # Two instances of one scope nest only through recursion (a scope inside a
            # procedure frame has a fixed lexical depth), so without recursion all count.
            mem_outer.append(outermost(base + rid, members, ends) if recursive
                             else np.ones(len(members), bool))

        self._nodes = NodeTable(
            kind=np.concatenate(cols["kind"]).astype(np.uint8),
            function=np.concatenate(cols["function"]),
            module=np.concatenate(cols["module"]),
            file=np.concatenate(cols["file"]),
            line=np.concatenate(cols["line"]),
            offset=np.concatenate(cols["offset"]).astype(np.uint64),
            call_line=np.concatenate(cols["call_line"]),
        )
        self._parent = np.concatenate(cols["parent"])
        self._group = np.concatenate(mem_group)
        self._member = np.concatenate(mem_node)
        self._outer = np.concatenate([m for m in mem_outer if m is not None])
        self._csr = csr(self._parent, len(self._parent))

    @property
    def nodes(self) -> NodeTable:
        return self._nodes

    @property
    def parent(self) -> I64:
        return self._parent

    def children(self, node: int) -> I64:
        off, ch = self._csr
        return ch[off[node]:off[node + 1]]

    def aggregate(self, incl: F64, excl: F64) -> tuple[F64, F64]:
        n = len(self._parent)
        o = self._outer
        vi = group_sum(self._group[o], incl[self._member[o]], n)
        ve = group_sum(self._group, excl[self._member], n)
        return vi, ve

    def members(self, node: int) -> I64:
        """The source-tree nodes a flat scope stands for (all instances, in preorder)."""
        return np.sort(self._member[self._group == node])

    def flatten(self, top: list[int]) -> list[int]:
        """hpcviewer's flatten: every top-level scope is replaced by its children; a leaf
        stays."""
        out: list[int] = []
        for t in top:
            ch = self.children(t)
            out.extend(ch.tolist() if len(ch) else [t])
        return out
