"""callpath: call path performance analysis in the tradition of HPCToolkit.

``callpath.open(path)`` reads a performance database in any supported format (HPCToolkit's
sparse v4 ``meta.db``/``profile.db``/``cct.db``/``trace.db``, or the older ``experiment.xml``
with ``*.metric-db`` files) and returns an :class:`~callpath.model.Experiment`.
"""

from typing import TYPE_CHECKING, Any

from callpath.errors import CallpathError, FormatError

if TYPE_CHECKING:
    from callpath.formats.detect import open_experiment as open
    from callpath.model import Experiment

__version__ = "0.1.0"
__all__ = ["CallpathError", "Experiment", "FormatError", "__version__", "open"]


def __getattr__(name: str) -> Any:
    """``open`` and ``Experiment`` on first use: the readers and the model import numpy and
    the whole model, which ``callpath run --pid`` or ``dump`` of a Python process do not
    need (every command line pays for what this file imports)."""
    if name == "open":
        from callpath.formats.detect import open_experiment

        return open_experiment
    if name == "Experiment":
        from callpath.model import Experiment

        return Experiment
    raise AttributeError(f"module 'callpath' has no attribute {name!r}")


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext callpath``: the ``%%callpath`` cell magic (callpath.notebook)."""
    from callpath.notebook import load_ipython_extension as load

    load(ipython)
