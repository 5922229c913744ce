"""Load modules, source files and functions: the small tables the CCT's nodes index into."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoadModule:
    """A binary used by the measured program (v4 Load Module Specification)."""

    path: str
    flags: int = 0


@dataclass(frozen=True)
class SourceFile:
    """A source file; ``copied`` means the database holds a copy under its ``src/`` folder and
    ``path`` is then relative to the database directory."""

    path: str
    copied: bool = False
    flags: int = 0  # all bits of the v4 flags field, bit 0 being ``copied``

    @property
    def original(self) -> str:
        """The path the source had where it was measured: a copy's ``src/`` + the absolute
        path without its leading slash (hpcprof's convention) read back as that absolute
        path. Users know their files by it; the copy's path is the database's business."""
        if self.copied and self.path.startswith("src/") and len(self.path) > 4:
            return "/" + self.path[4:].lstrip("/")
        return self.path


@dataclass(frozen=True)
class Function:
    """A named source-level construct (v4 Function Specification). ``module`` and ``file``
    index the experiment's tables, -1 when unknown; ``name`` may be empty for anonymous code."""

    name: str
    module: int = -1
    offset: int = 0
    file: int = -1
    line: int = 0
    flags: int = 0
    has_name: bool = True  # False when the database stores no name (pName == 0)
