"""The load module of Python code: its top-level package, so that the Flat view and every
report group a program's time by the library it is in.

A native frame's load module is the binary it was loaded from; Python code has no binary, and
calling each ``.py`` file a module of its own made the Flat view list every file twice (as
module and as file) and say nothing about which library the time went to. The importable
unit is the package: ``site-packages/_pytest/config/__init__.py`` belongs to ``_pytest``,
``lib/python3.11/json/encoder.py`` to ``json``. A file outside any package (a script, a
top-level module of the standard library such as ``threading.py``, namespace packages without
``__init__.py``, code from ``<frozen ...>`` or ``<string>``) stays its own module. Decided when
the database is made, from the files where the measurement ran; a file no longer there stays
its own module.
"""

from __future__ import annotations

import functools
import os

__all__ = ["package_root"]


@functools.lru_cache(maxsize=65536)
def package_root(file: str) -> str:
    """The directory of the top-level package holding the Python source ``file``, or ``file``
    itself when it is in no package (see the module docstring)."""
    if not file.endswith(".py") or not os.path.isabs(file):
        return file
    d = os.path.dirname(file)
    if not os.path.isfile(os.path.join(d, "__init__.py")):
        return file
    while True:
        up = os.path.dirname(d)
        if up == d or not os.path.isfile(os.path.join(up, "__init__.py")):
            return d
        d = up
