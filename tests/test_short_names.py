"""Files and load modules that share a base name are told apart in every view: a Python
program with two packages' ``__init__.py`` (and two ``core.py``), profiled for real, shows
``pkg_a/__init__.py`` and ``pkg_b/__init__.py`` as two rows with their own costs, never two
rows both called ``__init__.py``; a file whose base name is its own keeps it."""

from __future__ import annotations

import sys
from pathlib import Path

import callpath
from callpath.analysis.shortnames import file_names, unique_suffixes
from conftest import run_cli

BUSY = "def busy(n):\n    t = 0\n    for i in range(n):\n        t += i % 7\n    return t\n"


def _program(root: Path) -> Path:
    for pkg in ("pkg_a", "pkg_b"):
        (root / "lib" / pkg).mkdir(parents=True)
        (root / "lib" / pkg / "__init__.py").write_text(BUSY)
        (root / "lib" / pkg / "core.py").write_text(BUSY)
    main = root / "main.py"
    main.write_text(f"import sys\nsys.path.insert(0, {str(root / 'lib')!r})\n"
                    + "import pkg_a, pkg_b, pkg_a.core, pkg_b.core\n"
                    + "for m in (pkg_a, pkg_b, pkg_a.core, pkg_b.core):\n"
                    + "    m.busy(1_500_000)\n")
    return main


def test_same_base_names_are_told_apart(tmp_path: Path) -> None:
    # each busy() runs ~0.1 s or more: >= 100 samples at 1 kHz, so a row with no sample at
    # all (the only way a name could be missing) has probability below e^-100
    main = _program(tmp_path)
    db = tmp_path / "p.d"
    r = run_cli("profile", "-m", str(tmp_path / "p.m"), "-o", str(db), "--",
                sys.executable, str(main))
    assert r.returncode == 0, r.stderr
    exp = callpath.open(db)
    names = dict(zip((f.path for f in exp.files), file_names(exp), strict=True))
    want = {f"{pkg}/{base}" for pkg in ("pkg_a", "pkg_b") for base in ("__init__.py", "core.py")}
    assert want <= set(names.values()), names
    # (the database records the copies of the sources it holds: src/<the original path>)
    (main_name,) = [n for p, n in names.items() if p.endswith(str(main))]
    assert main_name == "main.py"
    # the Flat view: packages (Python's load modules), then their files
    flat = run_cli("report", str(db), "-v", "flat", "-d", "2").stdout
    depth = {line.split()[-1]: line.rindex(line.split()[-1]) for line in
             flat.splitlines()[2:]}  # the label's column: its depth in the tree
    rows = set(depth)
    assert want <= rows and "__init__.py" not in rows and "core.py" not in rows, flat
    assert {"pkg_a", "pkg_b"} <= rows and depth["pkg_a"] < depth["pkg_a/core.py"], flat
    lines = run_cli("report", str(db), "--hot-path").stdout
    assert "__init__.py:" not in lines.replace("pkg_a/__init__.py:", "").replace(
        "pkg_b/__init__.py:", ""), lines


def test_suffix_rules() -> None:
    """A suffix of whole components, as short as tells the path from the others of its base
    name; a path that is itself a suffix of another keeps its whole self."""
    got = unique_suffixes(["/a/b/__init__.py", "/c/b/__init__.py", "/x/__init__.py",
                           "/y/z.py", "b/__init__.py", "<frozen runpy>"])
    assert got[0].endswith("a/b/__init__.py") and got[1].endswith("c/b/__init__.py")
    assert got[2] == "x/__init__.py" and got[3] == "z.py" and got[5] == "<frozen runpy>"
    assert got[4] == "b/__init__.py"
    assert len(set(got)) == len(got)
