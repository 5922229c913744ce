"""Which reader a file needs, decided by its content (never by its name).

gzip or protobuf bytes → pprof; a JSON object → speedscope; a sample header followed by an
indented stack line → ``perf script``; lines ``frames COUNT`` → folded stacks. Anything else
is one error naming the file and the formats expected.
"""

from __future__ import annotations

from pathlib import Path

from callpath.errors import CallpathError, FormatError
from callpath.formats.import_build import StackSet

EXPECTED = ("expected folded stacks, a speedscope JSON file, a pprof profile.proto (gzipped "
            "or not) or 'perf script' output")


def detect(path: Path, data: bytes) -> str:
    """``pprof``, ``speedscope``, ``perf`` or ``folded``."""
    if not data.strip():
        raise FormatError(path, f"empty file ({EXPECTED})")
    if data[:2] == b"\x1f\x8b":
        return "pprof"
    try:
        text = data[:65536].decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start >= 65536 - 4:  # a character cut by the probe's end
            text = data[:e.start].decode("utf-8")
        else:
            return "pprof" if data[:1] in (b"\x0a", b"\x12") else "binary"
    head = text.lstrip()
    if head.startswith("{"):
        return "speedscope"
    from callpath.formats.import_text import FOLDED_LINE, looks_like_perf_script

    if looks_like_perf_script(text):
        return "perf"
    first = next((ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")), "")
    if FOLDED_LINE.match(first):
        return "folded"
    if data[:1] in (b"\x0a", b"\x12"):
        return "pprof"
    return "unknown"


def read_profile(path: str | Path) -> tuple[str, StackSet]:
    """The detected format and the samples of the file at ``path``."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except IsADirectoryError:
        raise CallpathError(f"{p}: is a directory ({EXPECTED})") from None
    except FileNotFoundError:
        raise CallpathError(f"{p}: no such file ({EXPECTED})") from None
    fmt = detect(p, data)
    if fmt == "pprof":
        from callpath.formats.import_pprof import read_pprof

        return fmt, read_pprof(p, data)
    if fmt in ("binary", "unknown"):
        raise FormatError(p, f"not a recognised profile ({EXPECTED})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(p, f"not UTF-8 text at byte {e.start} ({EXPECTED})") from None
    if fmt == "speedscope":
        from callpath.formats.import_json import read_json

        return fmt, read_json(p, text)
    from callpath.formats.import_text import read_folded, read_perf_script

    return fmt, (read_perf_script(p, text) if fmt == "perf" else read_folded(p, text))
