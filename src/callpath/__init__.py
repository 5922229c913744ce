"""callpath: call path performance analysis in the tradition of HPCToolkit.

``callpath.open(path)`` reads a performance database in any supported format (HPCToolkit's
sparse v4 ``meta.db``/``profile.db``/``cct.db``/``trace.db``, or the older ``experiment.xml``
with ``*.metric-db`` files) and returns an :class:`~callpath.model.Experiment`.
"""

from callpath.errors import CallpathError, FormatError
from callpath.formats.detect import open_experiment as open
from callpath.model import Experiment

__version__ = "0.1.0"
__all__ = ["CallpathError", "Experiment", "FormatError", "__version__", "open"]


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext callpath``: the ``%%callpath`` cell magic (callpath.notebook)."""
    from callpath.notebook import load_ipython_extension as load

    load(ipython)
