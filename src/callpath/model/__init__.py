"""The in-memory experiment model: calling context tree, metrics, execution contexts, values."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from callpath.model.cct import CCT, EntryPoint, NodeKind, Relation
    from callpath.model.contexts import ExecutionContext, Identifier, IdKind
    from callpath.model.experiment import (
        Experiment,
        build_experiment,
        propagate,
        standard_metric,
        standard_scopes,
        summarize,
    )
    from callpath.model.metrics import (
        Combine,
        Metric,
        PropagationScope,
        ScopeInstance,
        ScopeType,
        SummaryStatistic,
    )
    from callpath.model.tables import Function, LoadModule, SourceFile
    from callpath.model.values import ContextBlock, ProfileBlock, TraceLine, Traces

#: name -> the module that defines it, imported on first use (PEP 562): the measurement
#: writers need ``contexts`` alone, and importing this package must not cost them the rest
_WHERE = {
    "CCT": "callpath.model.cct",
    "Combine": "callpath.model.metrics",
    "ContextBlock": "callpath.model.values",
    "EntryPoint": "callpath.model.cct",
    "ExecutionContext": "callpath.model.contexts",
    "Experiment": "callpath.model.experiment",
    "Function": "callpath.model.tables",
    "IdKind": "callpath.model.contexts",
    "Identifier": "callpath.model.contexts",
    "LoadModule": "callpath.model.tables",
    "Metric": "callpath.model.metrics",
    "NodeKind": "callpath.model.cct",
    "ProfileBlock": "callpath.model.values",
    "PropagationScope": "callpath.model.metrics",
    "Relation": "callpath.model.cct",
    "ScopeInstance": "callpath.model.metrics",
    "ScopeType": "callpath.model.metrics",
    "SourceFile": "callpath.model.tables",
    "SummaryStatistic": "callpath.model.metrics",
    "TraceLine": "callpath.model.values",
    "Traces": "callpath.model.values",
    "build_experiment": "callpath.model.experiment",
    "propagate": "callpath.model.experiment",
    "standard_metric": "callpath.model.experiment",
    "standard_scopes": "callpath.model.experiment",
    "summarize": "callpath.model.experiment",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'callpath.model' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(where), name)


__all__ = [
    "CCT", "Combine", "ContextBlock", "EntryPoint", "ExecutionContext", "Experiment",
    "Function", "IdKind", "Identifier", "LoadModule", "Metric", "NodeKind", "ProfileBlock",
    "PropagationScope", "Relation", "ScopeInstance", "ScopeType", "SourceFile",
    "SummaryStatistic", "TraceLine", "Traces", "build_experiment", "propagate",
    "standard_metric", "standard_scopes", "summarize",
]
