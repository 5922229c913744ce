"""Build of the optional C extensions; everything else is in pyproject.toml.

``_callpath_walk`` is the Python sampler's stack walk in C (``src/callpath/measure/python/
_callpath_walk.c``). It is optional: where no compiler or no Python headers are found, the build
goes on without it and the sampler walks stacks in Python (same data, a few microseconds more
per sample). ``_callpath_native`` (``_callpath_native.c``) captures the Python and native
stacks of the same instant for ``callpath run --native``; without it that option falls back to
Python-only call paths and says so. ``_callpath_decode`` (``src/callpath/structure/
_callpath_decode.c``) decodes x86-64 instruction lengths and control flow for ``callpath struct``;
without it every instruction is decoded by iced-x86 (same rows, several times slower).
``_callpath_unwind`` (``src/callpath/measure/_callpath_unwind.c``) is the post-mortem unwinder's
level loop; without it ``measure/unwind.py`` unwinds in numpy (same frames, 3-4x slower on a
PyTorch run's 278-frame stacks). ``_callpath_records`` (``src/callpath/measure/gpu/
_callpath_records.c``) finds the records of the CUPTI library's raw files; without it
``measure/gpu/convert.py`` walks them in Python (same records, about 1 µs more per record).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("callpath.measure.python._callpath_walk",
                             ["src/callpath/measure/python/_callpath_walk.c"],
                             optional=True),
                   # signal-time capture of Python + native stacks (callpath run --native)
                   Extension("callpath.measure.python._callpath_native",
                             ["src/callpath/measure/python/_callpath_native.c"],
                             optional=True),
                   # the records of the CUPTI library's raw files (measure/gpu/convert.py)
                   Extension("callpath.measure.gpu._callpath_records",
                             ["src/callpath/measure/gpu/_callpath_records.c"],
                             optional=True),
                   # the post-mortem unwinder's level loop (measure/unwind.py)
                   Extension("callpath.measure._callpath_unwind",
                             ["src/callpath/measure/_callpath_unwind.c"],
                             optional=True),
                   # instruction lengths and flow for callpath struct (structure/cfg.py)
                   Extension("callpath.structure._callpath_decode",
                             ["src/callpath/structure/_callpath_decode.c"],
                             depends=["src/callpath/structure/_x86_table.h"],
                             optional=True)])
