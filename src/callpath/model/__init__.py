"""The in-memory experiment model: calling context tree, metrics, execution contexts, values."""

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

__all__ = [
    "CCT", "Combine", "ContextBlock", "EntryPoint", "ExecutionContext", "Experiment",
    "Function", "IdKind", "Identifier", "LoadModule", "Metric", "NodeKind", "ProfileBlock",
    "PropagationScope", "Relation", "ScopeInstance", "ScopeType", "SourceFile",
    "SummaryStatistic", "TraceLine", "Traces", "build_experiment", "propagate",
    "standard_metric", "standard_scopes", "summarize",
]
