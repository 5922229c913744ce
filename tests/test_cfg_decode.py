"""The C decoder (``structure/_callpath_decode.c``) against iced-x86, row for row, on the code
of real libraries: every instruction of libpython's and libstdc++'s ``.text``, numpy's
OpenBLAS and libcrypto (hand-written AVX/AVX-512 kernels: the VEX/EVEX instructions the C side
leaves to iced-x86) and, where installed, slices of PyTorch's libtorch_cpu.so."""

from __future__ import annotations

import ctypes.util
import glob
import os
import sysconfig
from pathlib import Path

import pytest

from callpath.structure import cfg
from callpath.structure.elf import open_elf

pytestmark = pytest.mark.skipif(cfg._c_decode is None,
                                reason="the C decoder extension is not built here")


def _libs() -> list[tuple[str, Path, float]]:
    """(label, path, fraction of .text to compare) of the libraries found here."""
    out: list[tuple[str, Path, float]] = []
    libdir, name = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY")
    if libdir and name and name.endswith(".so") and (Path(libdir) / name).is_file():
        out.append(("libpython", Path(libdir) / name, 1.0))
    for lib, frac in (("stdc++", 1.0), ("crypto", 1.0)):
        found = ctypes.util.find_library(lib)
        for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64"):
            if found and (Path(d) / found).is_file():
                out.append((lib, Path(d) / found, frac))
                break
    import numpy
    blas = sorted(glob.glob(os.path.join(os.path.dirname(numpy.__file__), os.pardir,
                                         "numpy.libs", "*openblas*.so*")))
    if blas:
        out.append(("openblas", Path(blas[0]), 0.25))
    torch = sorted(glob.glob("/work/torchenv/lib/python3*/site-packages/torch/lib/"
                             "libtorch_cpu.so"))
    if torch:
        out.append(("libtorch_cpu", Path(torch[0]), 0.02))
    return out


LIBS = _libs()


def _slices(size: int, frac: float) -> list[tuple[int, int]]:
    """Offsets to compare: the whole section, or 8 spread slices covering ``frac`` of it."""
    if frac >= 1.0:
        return [(0, size)]
    step = size // 8
    part = int(size * frac / 8)
    return [(k * step, k * step + part) for k in range(8)]


@pytest.mark.parametrize("label,path,frac", LIBS, ids=[x[0] for x in LIBS])
def test_c_decoder_rows_are_iced_rows(label: str, path: Path, frac: float) -> None:
    mod = open_elf(path)
    try:
        total = 0
        for sec in mod.text_sections:
            for a, b in _slices(sec.size, frac):
                lo, hi = sec.addr + a, sec.addr + b
                fast = cfg.decode(sec.data, sec.addr, lo, hi)
                ref = cfg.decode(sec.data, sec.addr, lo, hi, use_c=False)
                for col in ("ip", "end", "kind", "target", "flow"):
                    got, want = getattr(fast, col), getattr(ref, col)
                    if got != want:
                        i = next((k for k, (x, y) in enumerate(zip(got, want, strict=False))
                                  if x != y), min(len(got), len(want)))
                        at = ref.ip[min(i, len(ref.ip) - 1)]
                        raw = sec.data[at - sec.addr:at - sec.addr + 16].hex(" ")
                        pytest.fail(f"{label} {sec.name} {col} row {i} at {at:#x} ({raw}): "
                                    f"C {got[i:i + 2]} iced {want[i:i + 2]}")
                total += len(ref.ip)
        assert total > 1000
    finally:
        mod.close()


def test_rows_agree_on_truncated_and_prefixed_code() -> None:
    """Instructions cut by the range's end, prefix runs and padding go the same way."""
    samples = [
        bytes.fromhex("66 66 2e 0f 1f 84 00 00 00 00 00"),  # padding nop
        bytes.fromhex("f3 0f 1e fa 55 48 89 e5 e8 00 00 00 00 c3"),  # endbr64 ... ret
        bytes.fromhex("f2 e9 10 00 00 00 3e ff e0 f0 48 0f b1 11 48 b8") + b"\x01" * 8,
        bytes.fromhex("e8 01 02"),  # truncated call
        bytes.fromhex("0f 0b f4 cc 0f 05 c5 f8 77 62 f1 7c 48 58 c1 67 e3 fe 66 e8 00 00"),
    ]
    for raw in samples:
        for cut in range(1, len(raw) + 1):
            fast = cfg.decode(raw, 0x400000, 0x400000, 0x400000 + cut)
            ref = cfg.decode(raw, 0x400000, 0x400000, 0x400000 + cut, use_c=False)
            assert (fast.ip, fast.end, fast.kind, fast.target, fast.flow) == \
                (ref.ip, ref.end, ref.kind, ref.target, ref.flow), (raw.hex(" "), cut)


def test_structure_is_the_same_without_the_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the extension could not be built, iced-x86 decodes everything: the structure
    file of a real library is byte for byte the one the C decoder gives."""
    import io

    from callpath.formats.hpcstruct import write_hpcstruct
    from callpath.structure.binary import analyze_binary

    found = ctypes.util.find_library("stdc++")
    lib = next((Path(d) / found for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu",
                                          "/usr/lib64") if found and (Path(d) / found).is_file()),
               None)
    if lib is None:
        pytest.skip("libstdc++ is not installed as a shared library here")
    fast = io.StringIO()
    write_hpcstruct([analyze_binary(lib)], fast)
    from callpath.structure import havlak

    monkeypatch.setattr(cfg, "_c_decode", None)
    monkeypatch.setattr(havlak, "_c", None)  # the loops in Python too
    slow = io.StringIO()
    write_hpcstruct([analyze_binary(lib)], slow)
    assert fast.getvalue().count("<L ") > 100  # loops found: the CFG was exercised
    assert fast.getvalue() == slow.getvalue()
