"""A real Python program, really sampled and attributed (``callpath profile``): a loop whose back
edge CPython 3.11 leaves without a line is charged to the loop, not to the ``def`` line."""

from __future__ import annotations

import numpy as np
import pytest

import callpath
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
