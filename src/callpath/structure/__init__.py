"""Structure recovery (``callpath struct``): what a load module contains, statically.

From an ELF binary (and its debug information, where there is any) this package recovers the
procedures, the inlined code, the loop nests and the source lines that a sample address belongs
to; from a Python source file, the same model from its ``ast``. The model
(:class:`~callpath.model.structure.Structure`) is what ``callpath prof`` joins samples with, and
what :mod:`callpath.formats.hpcstruct` writes and reads as HPCToolkit's structure XML.

Entry points: :func:`~callpath.structure.binary.analyze_binary` (a path to an ELF file) and
:func:`~callpath.structure.python_ast.structure_of_python` (a path to a ``.py`` file).
"""

from __future__ import annotations
