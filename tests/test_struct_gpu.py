"""``callpath struct`` of NVIDIA GPU binaries: cubins compiled here by ``nvcc`` (``-lineinfo``,
``-G``, none), a fatbin of two architectures, and the cubin hpcrun saved of HPCToolkit's
``loops.cu`` (whose structure hpcstruct wrote beside it, the oracle).

The recovered functions, source lines, inlined device functions and loops are checked against
the source: each ``for`` statement is marked ``// loop`` in ``LOOPS_CU`` and every mark must
come out as a loop at that line, nested as written. ``nvcc`` is needed to compile (skipped
with the reason without it: CI has none); loops need ``nvdisasm`` (a CUDA toolkit or PyPI's
``nvidia-cuda-nvdisasm``), without which the structure has functions and lines only and says
so in one line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from callpath.structure.cubin import (
    Cubin,
    _functions_of_elftools,
    analyze_gpu_binary,
    cubins_of,
    find_nvdisasm,
    functions_of,
)
from callpath.structure.model import Kind, Structure
from conftest import run_cli, shared_path

LOOPS_CU = """\
__device__ __noinline__ void scale(volatile double* x, int n) {
  for (int i = 0; i < n; i++)  // loop scale
    *x = *x * 2 + 3;
}

__device__ static void twice(volatile double* x) {
  *x = *x * 2 + 1;  // twice body
  *x = *x * 2 + 1;
}

__global__ void kern(double* out, int n) {
  volatile double x = out[threadIdx.x];  // kern entry
  for (int i = 0; i < n; i++) {  // loop outer
    for (int j = 0; j < n; j++)  // loop inner
      x = x * 2 + 3;
    twice(&x);
  }
  scale(&x, n);
  out[threadIdx.x] = x;
}

__global__ void other(float* y) { y[threadIdx.x] *= 2; }  // other
"""


def _nvcc() -> str:
    found = shutil.which("nvcc") or next(
        (str(p) for p in sorted(Path("/usr/local").glob("cuda*/bin/nvcc"), reverse=True)
         if os.access(p, os.X_OK)), None)
    if found is None:
        pytest.skip("nvcc is not installed (CUDA toolkit): GPU binaries cannot be compiled")
    return found


def _line(tag: str) -> int:
    return next(n for n, text in enumerate(LOOPS_CU.splitlines(), 1) if text.endswith(tag))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    nvcc = _nvcc()
    d = tmp_path_factory.mktemp("cubins")
    src = d / "loops.cu"
    src.write_text(LOOPS_CU)
    out: dict[str, Path] = {}
    for name, args in {"lineinfo": ["-cubin", "-arch=sm_90", "-lineinfo"],
                       "G": ["-cubin", "-arch=sm_90", "-G"],
                       "plain": ["-cubin", "-arch=sm_90"],
                       "fatbin": ["-fatbin", "-lineinfo", "-gencode=arch=compute_80,code=sm_80",
                                  "-gencode=arch=compute_90,code=sm_90"]}.items():
        dest = d / f"loops-{name}.{'fatbin' if name == 'fatbin' else 'cubin'}"
        run = subprocess.run([nvcc, *args, "-o", str(dest), str(src)], capture_output=True,
                             text=True, timeout=300, check=False)
        assert run.returncode == 0, run.stderr
        out[name] = dest
    return out


#: the non-inlined device function: a whole-program build places it in its caller's section,
#: named ``$caller$callee`` (as hpcstruct names it), else it is the demangled symbol
SCALE = ("$_Z4kernPdi$_Z5scalePVdi", "scale(double volatile*, int)")


def _procs(s: Structure) -> dict[str, int]:
    """Procedures by name (the device function ``scale`` as ``"scale"``)."""
    out = {s.text(int(s.name[i])): i for i in range(len(s)) if s.kind[i] == Kind.PROC}
    for name in SCALE:
        if name in out:
            out["scale"] = out.pop(name)
    return out


def _inside(s: Structure, scope: int) -> list[int]:
    """The scopes below ``scope`` (preorder: a contiguous run of deeper scopes)."""
    out = []
    for i in range(scope + 1, len(s)):
        if scope not in s.chain(i):
            break
        out.append(i)
    return out


def _lines(s: Structure, scope: int) -> set[int]:
    return {int(s.line[i]) for i in _inside(s, scope) if s.kind[i] == Kind.STMT}


def test_functions_and_lines_of_a_lineinfo_cubin(built: dict[str, Path]) -> None:
    g = analyze_gpu_binary(built["lineinfo"], nvdisasm=None)
    s = g.structure
    procs = _procs(s)
    assert set(procs) == {"kern(double*, int)", "other(float*)", "scale"}
    # each function in the source file; its first instruction is its opening line, or the
    # next one where the compiler gave the entry no row of its own; the function's line is
    # the smallest of its code's, inlined code included, as hpcstruct gives it
    for name, tag in (("kern(double*, int)", "kern(double* out, int n) {"),
                      ("other(float*)", "// other"),
                      ("scale", "int n) {")):
        p = procs[name]
        assert s.text(int(s.file[p])) == str(built["lineinfo"].parent / "loops.cu")
        entry = int(s.lookup([int(s.range_lo[s.range_ptr[p]])])[0])
        assert _line(tag) <= int(s.line[entry]) <= _line(tag) + 1, name
        assert int(s.line[p]) == min(_lines(s, p)), name
    # statements are lines of the function's code; the statements' ranges cover the function
    kern = procs["kern(double*, int)"]
    assert {_line("// kern entry"), _line("// loop outer"), _line("// loop inner")} \
        <= _lines(s, kern)
    assert max(_lines(s, kern)) < _line("// other")
    # twice() is inlined into kern: its lines sit in an inlined-code scope naming it, called
    # from the line that calls it
    aliens = [i for i in _inside(s, kern) if s.kind[i] == Kind.ALIEN]
    # (a static function's name carries its translation unit's namespace, as in hpcstruct's)
    (name,) = [s.text(int(s.name[i])) for i in aliens]
    assert name.endswith("::twice(double volatile*)")
    assert int(s.call_line[aliens[0]]) == _line("    twice(&x);")
    assert _line("// twice body") in _lines(s, aliens[0])
    assert not any(s.kind[i] == Kind.LOOP for i in range(len(s)))  # no nvdisasm asked for
    assert g.notes == []
    # every address of the function maps to a scope of it
    lo = int(s.range_lo[s.range_ptr[kern]])
    assert int(s.lookup([lo])[0]) in _inside(s, kern)


def _same_as_pyelftools(cubins: list[Cubin]) -> None:
    for cb in cubins:
        got = functions_of(cb)
        assert got and got == _functions_of_elftools(cb, "cubin")


def test_function_symbols_are_pyelftools_reading(built: dict[str, Path]) -> None:
    """The cubins' function symbols as read directly (the symbol table as one array: a
    program's modules hold thousands) are pyelftools's reading of the same files, symbol for
    symbol: name, file offset, size (after the whole-program rule) and section, for every
    cubin built here, each architecture of the fatbin at its own offset."""
    cubins = [cb for path in built.values()
              for cb in cubins_of(path.read_bytes(), path=str(path))[0]]
    assert len(cubins) == 5
    _same_as_pyelftools(cubins)
    kern = [f.address for cb in cubins_of(built["fatbin"].read_bytes())[0]
            for f in functions_of(cb) if f.name == "_Z4kernPdi"]
    assert len(kern) == 2 and kern[0] != kern[1]


def test_function_symbols_of_hpcruns_cubin_are_pyelftools_reading() -> None:
    """The same for the cubin hpcrun saved of HPCToolkit's ``loops.cu`` (no nvcc needed)."""
    hpcrun = shared_path("hpctoolkit/meas/loops-cuda-nvidia-t.m/gpubins")
    _same_as_pyelftools([cb for p in sorted(hpcrun.iterdir())
                         for cb in cubins_of(p.read_bytes())[0]])


def test_cubin_without_line_information(built: dict[str, Path]) -> None:
    g = analyze_gpu_binary(built["plain"], nvdisasm=None)
    assert set(_procs(g.structure)) == {"kern(double*, int)", "other(float*)", "scale"}
    assert not any(g.structure.kind == Kind.STMT)
    assert any("no line information" in n for n in g.notes)


def test_fatbin_holds_both_architectures(built: dict[str, Path]) -> None:
    data = built["fatbin"].read_bytes()
    cubins, notes = cubins_of(data)
    assert sorted(c.arch for c in cubins) == [80, 90] and notes == []
    s = analyze_gpu_binary(built["fatbin"], nvdisasm=None).structure
    kerns = [i for i in range(len(s)) if s.kind[i] == Kind.PROC
             and s.text(int(s.name[i])) == "kern(double*, int)"]
    # one per architecture, each at its offset in the fatbin, inside its cubin's bytes
    starts = sorted(int(s.range_lo[s.range_ptr[k]]) for k in kerns)
    assert len(starts) == 2
    for c, a in zip(sorted(cubins, key=lambda c: c.offset), starts, strict=True):
        assert c.offset < a < c.offset + len(c.data)
    for k in kerns:
        assert _line("// loop inner") in _lines(s, k)


@pytest.mark.parametrize("kind", ["lineinfo", "G"])
def test_loops_with_nvdisasm(built: dict[str, Path], kind: str) -> None:
    tool = find_nvdisasm()
    if tool is None:
        pytest.skip("nvdisasm is not installed (CUDA toolkit or pip nvidia-cuda-nvdisasm)")
    g = analyze_gpu_binary(built[kind], nvdisasm=tool)
    s = g.structure
    assert g.notes == []
    procs = _procs(s)
    kern = procs["kern(double*, int)"]
    loops = {int(s.line[i]): i for i in _inside(s, kern) if s.kind[i] == Kind.LOOP}
    assert set(loops) == {_line("// loop outer"), _line("// loop inner")}
    # the inner loop nests in the outer one
    assert loops[_line("// loop outer")] in s.chain(loops[_line("// loop inner")])
    scale = procs["scale"]
    # (optimised, the loop is unrolled into a main loop and a remainder loop: both its line)
    assert {int(s.line[i]) for i in _inside(s, scale) if s.kind[i] == Kind.LOOP} \
        == {_line("// loop scale")}
    assert not any(s.kind[i] == Kind.LOOP for i in _inside(s, procs["other(float*)"]))


def test_struct_cli_reproduces_hpcstruct_of_hpcrun_cubin(tmp_path: Path) -> None:
    """The cubin hpcrun saved for HPCToolkit's loops-cuda measurement: the function, its
    line, its statements' lines and address ranges and the inlined device function are
    hpcstruct's (``structs/*.gpubin-gpucfg-yes.hpcstruct``), and with nvdisasm the whole
    structure is, loop included."""
    from callpath.formats.hpcstruct import read_hpcstruct

    meas = shared_path("hpctoolkit", "meas", "loops-cuda-nvidia-t.m")
    (cubin,) = (meas / "gpubins").glob("*.gpubin")
    (oracle,) = read_hpcstruct(next((meas / "structs").glob("*.gpubin-*.hpcstruct")))
    out = tmp_path / "k.hpcstruct"
    run = run_cli("struct", str(cubin), "-o", str(out), "--no-cache", check=True)
    (ours,) = read_hpcstruct(out)

    def scopes(s: Structure) -> list[tuple[object, ...]]:
        """Every scope in preorder: kind, depth, names, lines, address ranges."""
        return [(int(s.kind[i]), len(s.chain(i)), s.text(int(s.name[i])),
                 s.text(int(s.file[i])), int(s.line[i]), s.text(int(s.call_file[i])),
                 int(s.call_line[i]), int(s.target[i]), tuple(s.ranges(i)))
                for i in range(1, len(s))]

    if find_nvdisasm() is not None:
        assert scopes(ours) == scopes(oracle)
        assert ours.has_calls == oracle.has_calls
        return
    assert "nvdisasm" in run.stderr
    # without the loop: the same scopes with the loop's own taken out, and the statements'
    # ranges of each line (a loop splits a line's statements) merged
    def flat(s: Structure) -> tuple[list[tuple[object, ...]], dict[int, set[tuple[int, int]]]]:
        lines: dict[int, set[tuple[int, int]]] = {}
        rest = []
        for row in scopes(s):
            if row[0] == Kind.STMT:
                lines.setdefault(int(str(row[4])), set()).update(row[8])  # type: ignore[arg-type]
            elif row[0] != Kind.LOOP:
                rest.append((row[0], row[2], row[3], row[4], row[8]))
        return rest, {ln: _merge(rs) for ln, rs in lines.items()}

    assert flat(ours) == flat(oracle)
    assert not any(ours.kind == Kind.LOOP)


def _merge(rs: set[tuple[int, int]]) -> set[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(rs):
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return set(out)
