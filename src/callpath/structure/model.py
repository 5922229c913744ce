"""The structure model's old import path, kept while other branches still import it.

The model itself is :mod:`callpath.model.structure`: a data model that both the analysis of
binaries (:mod:`callpath.structure`) and the structure file format
(:mod:`callpath.formats.hpcstruct`) use, so it sits below both; with it here, ``formats/``
imported ``structure/`` while ``structure/`` imported ``formats/``. New code imports
:mod:`callpath.model.structure`; this module goes once every import has moved.
"""

from callpath.model.structure import Kind, Structure, StructureBuilder, concat_structures

__all__ = ["Kind", "Structure", "StructureBuilder", "concat_structures"]
