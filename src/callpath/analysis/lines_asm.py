"""Machine instructions of source lines (PerfVisS Figure 2). Placeholder until the
disassembler lands; see line_instructions."""

from __future__ import annotations

from typing import Any

from callpath.model import Experiment


class InstructionListing(list[dict[str, Any]]):
    """A list of instructions (dicts) with ``reason``: why it is empty, or None."""

    reason: str | None = None


def line_instructions(exp: Experiment, file: str | int, line: int, around: int = 0
                      ) -> InstructionListing:
    out = InstructionListing()
    out.reason = "disassembly is not implemented yet"
    return out
