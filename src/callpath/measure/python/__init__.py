"""Measurement of Python programs: Python-level call paths of every thread and process.

``launch.run_python`` starts a Python program with the bootstrap in ``shim/`` on its path, so that
``sampler.py`` samples it (and every Python process it starts) from a timer signal and appends
per-process raw files to the measurement directory; ``rawfile`` reads them back and ``summary``
prints the quick summary. Only ``sampler.py`` (with the modules it loads beside it: ``walk.py``,
``measfile.py``, ``timer.py``, and ``native_capture.py`` under ``--native``) and ``shim/`` run
inside the measured program.
"""
