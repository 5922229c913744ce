"""Havlak's loop nesting forest in C (``structure/_callpath_decode.c``'s ``loops``) against
the Python of ``structure/havlak.py``, loop for loop: on the control flow graph of every
procedure of real libraries (libpython, libstdc++), and on seeded random graphs, most of them
irreducible (several entries into a cycle), with self-loops, repeated edges and unreachable
nodes, which compiled code has few of."""

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
def test_c_loops_are_python_loops_on_real_procedures(lib: Path) -> None:
    from callpath.structure.binary import PreparedModule
    from callpath.structure.cfg import build_cfg, decode
    from callpath.structure.elf import open_elf

    mod = open_elf(lib)
    try:
        prep = PreparedModule(mod, demangle_all=False)
        with_loops = graphs = 0
        for p in prep.procs:
            sec = next((s for s in mod.text_sections if s.addr <= p.entry < s.addr + s.size),
                       None)
            if sec is None or p.end <= p.entry:
                continue
            code = decode(sec.data, sec.addr, p.entry, min(p.end, sec.addr + sec.size))
            graph = build_cfg(code, p.entry, p.end)
            if not graph.succ:
                continue
            fast = find_loops(graph.succ)
            assert fast == find_loops(graph.succ, use_c=False), (lib.name, hex(p.entry))
            graphs += 1
            with_loops += bool(fast[0])
    finally:
        mod.close()
    assert graphs > 1000 and with_loops > 300, (graphs, with_loops)


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


def test_c_loops_reject_malformed_graphs() -> None:
    assert havlak._c is not None
    with pytest.raises(ValueError):
        havlak._c.loops([[1]], 0)
    with pytest.raises(ValueError):
        havlak._c.loops([[0]], 1)
    with pytest.raises(TypeError):
        havlak._c.loops([(0,)], 0)  # type: ignore[list-item]
