"""The engine under ``callpath report``, ``lines``, ``export``, ``diff`` and the viewer.

It holds what one look at a database needs and caches: the composition tree source →
filters → metric columns → view (:mod:`~callpath.engine.compose`), a database's view state
and its caches (:mod:`~callpath.engine.state`, :mod:`~callpath.engine.database`), node keys
(:mod:`~callpath.engine.keys`), the trace index and its sampling
(:mod:`~callpath.engine.traces`), comparison databases (:mod:`~callpath.engine.comparison`),
notes (:mod:`~callpath.engine.notes`) and source files (:mod:`~callpath.engine.sources`).

Layers (each imports only those below it; docs/architecture.md)::

    cli/  view/ (HTTP)
        engine/
    present/  analysis/  attribute/  structure/  measure/
        formats/
            model/

The CLI and :mod:`callpath.view` call the engine; the engine never imports either.
"""
