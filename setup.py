"""Build of the one optional C extension; everything else is in pyproject.toml.

``_callpath_walk`` is the Python sampler's stack walk in C (``src/callpath/measure/python/
_callpath_walk.c``). It is optional: where no compiler or no Python headers are found, the build
goes on without it and the sampler walks stacks in Python (same data, a few microseconds more
per sample).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("callpath.measure.python._callpath_walk",
                             ["src/callpath/measure/python/_callpath_walk.c"],
                             optional=True)])
