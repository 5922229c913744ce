"""The control flow graph and Havlak's loop nesting forest in C (``structure/
_callpath_decode.c``'s ``cfg`` and ``loops``) against the Python of ``structure/cfg.py`` and
``structure/havlak.py``, block for block and loop for loop: on every procedure of real
libraries (libpython, libstdc++; their jump tables and no-return callees included), and, for
the loops, on seeded random graphs, most of them irreducible (several entries into a cycle),
with self-loops, repeated edges and unreachable nodes, which compiled code has few of."""

from __future__ import annotations

import ctypes.util
import random
import sysconfig
from pathlib import Path

import pytest

from callpath.structure import havlak
from callpath.structure.havlak import find_loops

pytestmark = pytest.mark.skipif(havlak._c is None,
                                reason="the C extension is not built here")


def _libs() -> list[Path]:
    out: list[Path] = []
    libdir, name = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY")
    if libdir and name and name.endswith(".so") and (Path(libdir) / name).is_file():
        out.append(Path(libdir) / name)
    found = ctypes.util.find_library("stdc++")
    for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64"):
        if found and (Path(d) / found).is_file():
            out.append(Path(d) / found)
            break
    return out


@pytest.mark.parametrize("lib", _libs(), ids=lambda p: p.name)
def test_c_graphs_and_loops_are_python_ones_on_real_procedures(lib: Path) -> None:
    from callpath.structure.binary import INDIRECT, PreparedModule
    from callpath.structure.cfg import build_cfg, decode
    from callpath.structure.elf import open_elf
    from callpath.structure.jump_tables import resolve_tables

    mod = open_elf(lib)
    try:
        prep = PreparedModule(mod, demangle_all=False)
        with_loops = graphs = tables = stops = 0
        for p in prep.procs:
            sec = next((s for s in mod.text_sections if s.addr <= p.entry < s.addr + s.size),
                       None)
            if sec is None or p.end <= p.entry:
                continue
            code = decode(sec.data, sec.addr, p.entry, min(p.end, sec.addr + sec.size))
            if INDIRECT in code.kind:
                code.tables = resolve_tables(sec.data, sec.addr, p.entry, p.end, code.ip,
                                             code.kind, prep.reader.read, INDIRECT)
                tables += bool(code.tables)
            noret = prep.noreturn_for(p.entry)
            graph = build_cfg(code, p.entry, p.end, noret.__contains__, memo=noret.memo)
            slow = build_cfg(code, p.entry, p.end, noret.__contains__, use_c=False)
            assert graph == slow, (lib.name, hex(p.entry))
            stops += sum(1 for b, s in enumerate(graph.succ) if not s and
                         code.kind[graph.last[b]] == 5)
            if not graph.succ:
                continue
            fast = find_loops(graph.succ)
            assert fast == find_loops(graph.succ, use_c=False), (lib.name, hex(p.entry))
            graphs += 1
            with_loops += bool(fast[0])
    finally:
        mod.close()
    # loops, jump tables and calls that never return were all met
    assert graphs > 1000 and with_loops > 300 and tables > 10 and stops > 10, \
        (graphs, with_loops, tables, stops)


def test_c_loops_are_python_loops_on_random_graphs() -> None:
    rng = random.Random(27)
    irreducible = 0
    for _ in range(5000):
        n = rng.randint(1, 40)
        succ = [[rng.randrange(n) for _ in range(rng.choice((0, 1, 1, 2, 2, 3)))]
                for _ in range(n)]
        entry = rng.randrange(n)
        fast = find_loops(succ, entry)
        assert fast == find_loops(succ, entry, use_c=False), (succ, entry)
        irreducible += any(not lp.reducible for lp in fast[0])
    assert irreducible > 500  # the irreducible paths were taken


def test_c_graph_of_no_instructions_and_bad_rows() -> None:
    from callpath.structure.cfg import Code, build_cfg

    assert build_cfg(Code(), 0, 0) == build_cfg(Code(), 0, 0, use_c=False)
    assert havlak._c is not None
    with pytest.raises(ValueError):
        havlak._c.cfg([1], [2], [0], [0], [3], {}, 0, 4, None, None)
    with pytest.raises(ValueError):
        havlak._c.cfg([1, 2], [2], [0], [0], [], {}, 0, 4, None, None)


def test_c_loops_reject_malformed_graphs() -> None:
    assert havlak._c is not None
    with pytest.raises(ValueError):
        havlak._c.loops([[1]], 0)
    with pytest.raises(ValueError):
        havlak._c.loops([[0]], 1)
    with pytest.raises(TypeError):
        havlak._c.loops([(0,)], 0)  # type: ignore[list-item]
