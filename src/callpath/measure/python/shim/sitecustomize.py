"""Bootstrap of the Python sampler, run by ``site`` in every process of a measured program.

The launcher puts this folder first on ``PYTHONPATH`` and exports ``CALLPATH_PY_OUT``; every
Python interpreter started below it (the program itself, ``subprocess`` children running Python,
``multiprocessing`` spawn and forkserver workers) therefore imports this module before any user
code. It loads ``sampler.py`` by path, so that the measured process imports neither the
``callpath`` package nor numpy, starts the sampler, then takes itself off ``sys.path`` and runs
the ``sitecustomize`` it hides (Debian ships one), so the program sees its usual environment.
"""

import os
import sys


def _callpath_bootstrap() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    if os.environ.get("CALLPATH_PY_OUT"):
        try:
            import importlib.util
            path = os.path.join(os.path.dirname(here), "sampler.py")
            spec = importlib.util.spec_from_file_location("_callpath_pysampler", path)
            if spec is not None and spec.loader is not None:
                mod = importlib.util.module_from_spec(spec)
                sys.modules["_callpath_pysampler"] = mod
                spec.loader.exec_module(mod)
                mod.start_from_environment()
        except Exception as e:  # never stop the user's program because measurement failed
            sys.stderr.write(f"callpath: warning: Python sampler not started: {e}\n")
    # Hand over to the sitecustomize that this one shadows, if there is one.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    this = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        if this is not None:
            sys.modules["sitecustomize"] = this
    except Exception as e:
        sys.stderr.write(f"callpath: warning: the program's sitecustomize failed: {e}\n")


_callpath_bootstrap()
