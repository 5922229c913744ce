"""A real Python program, really sampled and attributed (``callpath profile``): the frames of
code objects that a file's structure cannot tell apart by line (lambdas, generator expressions,
class bodies) carry their own names, and a loop whose back edge CPython 3.11 leaves without a
line is charged to the loop, not to the ``def`` line; forked workers carry their own thread
ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import callpath
from callpath.formats import measdir
from callpath.model import Experiment, NodeKind
from conftest import ROOT, run_cli
from prof_tree import find

PROGRAM = ROOT / "tests" / "python_programs" / "anonymous.py"


def _marked(marker: str) -> int:
    for i, text in enumerate(PROGRAM.read_text().splitlines(), 1):
        if "#" in text and text.split("#", 1)[1].split()[-1] == marker:
            return i
    raise AssertionError(f"no line marked {marker}")


@pytest.fixture(scope="module")
def exp(tmp_path_factory: pytest.TempPathFactory) -> Experiment:
    d = tmp_path_factory.mktemp("py-anon")
    db = d / "db"
    run_cli("profile", "-o", str(db), "--", "python", str(PROGRAM), "3000000", check=True)
    return callpath.open(db)


def _samples(exp: Experiment) -> np.ndarray:
    [name] = [m.name for m in exp.metrics if m.name == "CPUTIME (samples)"]
    return np.asarray(exp.inclusive(name))


def _names(exp: Experiment, nodes: list[int]) -> list[str]:
    return [exp.functions[int(exp.cct.function[n])].name for n in nodes]


def test_anonymous_code_objects_are_named_as_python_names_them(exp: Experiment) -> None:
    incl = _samples(exp)
    # Each part runs 0.1-0.4 s at 1 kHz: 100-400 samples where 10 are asked for. The lambda's
    # share is its frames' (map calls it from C; the rest of that line is <module>'s).
    for name, line in (("evens.<locals>.<genexpr>", _marked("GENEXPR")),
                       ("<lambda>", _marked("LAMBDA")), ("Table", _marked("CLASSBODY"))):
        nodes = [n for n in find(exp, NodeKind.FUNCTION, name=name)
                 if exp.functions[int(exp.cct.function[n])].line == line]
        assert nodes and sum(incl[n] for n in nodes) >= 10, (name, _names(exp, nodes))
    # before: a frame of the lambda or the class body was named after the function around its
    # line, here <module>, and read as <module> calling <module>
    mine = [n for n in find(exp, NodeKind.FUNCTION, name="<module>")
            if exp.functions[int(exp.cct.function[n])].line == 1]
    mine = [n for n in mine if str(exp.files[exp.functions[int(exp.cct.function[n])].file]
                                   .path).endswith("anonymous.py")]
    assert len(mine) == 1
    assert not [n for n in find(exp, NodeKind.FUNCTION, name="<module>", within=mine[0])
                if exp.functions[int(exp.cct.function[n])].file
                == exp.functions[int(exp.cct.function[mine[0]])].file]


def test_loop_back_edge_without_line_is_the_loop(exp: Experiment) -> None:
    incl = _samples(exp)
    [spin] = find(exp, NodeKind.FUNCTION, name="spin")
    head = sum(incl[n] for n in find(exp, NodeKind.LINE, line=_marked("LOOPHEAD"), within=spin))
    fn_line = exp.functions[int(exp.cct.function[spin])].line
    at_def = sum(incl[n] for n in find(exp, NodeKind.LINE, line=fn_line, within=spin))
    # The loop makes no call, so the interpreter runs the sampler's handler only at the loop's
    # back edge (and once at the coroutine's start): every sample but that one is at the back
    # edge, charged to the `for` line; it was charged to the `async def` line.
    assert incl[spin] >= 100, incl[spin]
    assert head >= 0.9 * incl[spin], (head, at_def, incl[spin])
    assert at_def <= 0.05 * incl[spin], (head, at_def, incl[spin])


def test_forked_workers_carry_their_own_thread_ids(tmp_path: Path) -> None:
    out = tmp_path / "m"
    pool = ROOT / "tests" / "python_programs" / "pool.py"
    run_cli("run", "-o", str(out), "--", "python", str(pool), "fork", check=True)
    forked = [p for p in measdir.read(out).processes if p.info.get("forked_from")]
    assert len(forked) >= 3
    for p in forked:
        # a forked worker's only thread is its main thread, whose tid is the process's pid;
        # it was labelled with the parent's (3.11 leaves Thread.native_id stale after fork)
        assert p.threads[0].tid == p.pid != p.info["forked_from"], (p.pid, p.threads[0].info)
