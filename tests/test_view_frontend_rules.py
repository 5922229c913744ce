"""The viewer's front end keeps its two rules (docs/view.md "Front end"):

* no module changes another module's objects: no assignment to a property of an imported
  binding, of an object made from an imported class, or of a pane handed over as a hook
  (``tree.draw = ...``, ``trace.refresh = ...``, ``tree.hooks.onSelect = ...``, ``state.db =
  ...`` outside store.js). Features add what they draw through the store's topics and the
  panes' methods;
* every HTTP request goes through the request layer ``api.js``: no ``fetch(``,
  ``XMLHttpRequest``, ``EventSource`` or ``sendBeacon`` elsewhere.

The scan reads the real files under ``src/callpath/view/static``; the second group of tests
feeds it the patterns the front end once held, so that the scan is known to catch them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import ROOT

STATIC = ROOT / "src" / "callpath" / "view" / "static"
REQUEST_LAYER = "api.js"

# a "/" after one of these (or at the start) opens a regular expression, not a division
_REGEX_BEFORE = set("(,=:[!&|?{};+-*%<>~^")
_REGEX_KEYWORD = re.compile(r"\b(?:return|typeof|case|in|of|void|delete|throw|new)\s*$")


def code_only(src: str) -> str:
    """The source with comments, strings, template literals and regular expressions blanked
    (same length, newlines kept), so that the patterns below match code only."""
    out = list(src)
    i, n = 0, len(src)

    def blank(a: int, b: int) -> None:
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    last = ""  # the last significant character of code
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c in "'\"`":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            blank(i + 1, j)
            i = j + 1
            last = c
        elif c == "/" and (not last or last in _REGEX_BEFORE
                           or _REGEX_KEYWORD.search(src[max(0, i - 12):i])):
            j, in_class = i + 1, False
            while j < n and src[j] != "\n" and (src[j] != "/" or in_class):
                if src[j] == "\\":
                    j += 1
                elif src[j] == "[":
                    in_class = True
                elif src[j] == "]":
                    in_class = False
                j += 1
            blank(i + 1, j)
            i = j + 1
            last = "/"
        else:
            if not c.isspace():
                last = c
            i += 1
    return "".join(out)


_IDENT = r"[A-Za-z_$][\w$]*"


def foreign_names(code: str) -> set[str]:
    """Names that hold another module's objects: imported bindings, objects made from an
    imported class, the hooks a feature was handed (and what it destructures from them)."""
    names: set[str] = {"hooks"}
    for m in re.finditer(r"\bimport\s+(.*?)\s+from\b", code, re.S):
        spec = m.group(1)
        for part in re.findall(r"\{([^}]*)\}", spec):
            for item in part.split(","):
                item = item.strip()
                if item:
                    names.add(item.split(" as ")[-1].strip())
        for ns in re.findall(r"\*\s+as\s+(" + _IDENT + ")", spec):
            names.add(ns)
        default = re.match(r"\s*(" + _IDENT + r")\s*(?:,|$)", spec)
        if default:
            names.add(default.group(1))
    classes = {n for n in names if n[:1].isupper()}
    for m in re.finditer(r"\b(?:const|let|var)\s+(" + _IDENT + r")\s*=\s*new\s+(" + _IDENT + ")",
                         code):
        if m.group(2) in classes:
            names.add(m.group(1))
    for m in re.finditer(r"\b(?:const|let|var)\s*\{([^}]*)\}\s*=\s*(" + _IDENT + ")", code):
        if m.group(2) in names or m.group(2) == "h":
            for item in m.group(1).split(","):
                item = item.strip().split(":")[-1].strip()
                if re.fullmatch(_IDENT, item):
                    names.add(item)
    return names


_ASSIGN = r"\s*(?:=(?![=>])|\+=|-=|\*=|/=|%=|\|\|=|&&=|\?\?=|\+\+|--)"


def violations(name: str, src: str) -> list[str]:
    """What breaks the rules in one module's source: one line per finding."""
    code = code_only(src)
    found: list[str] = []

    def where(pos: int) -> str:
        line = code.count("\n", 0, pos) + 1
        return f"{name}:{line}: {src.splitlines()[line - 1].strip()}"

    for who in sorted(foreign_names(code)):
        target = r"(?<![\w$.])" + re.escape(who) + r"(?:\s*\.\s*" + _IDENT + r"|\s*\[[^\]\n]*\])+"
        for m in re.finditer(target + _ASSIGN, code):
            found.append(f"assigns to another module's object: {where(m.start())}")
        for m in re.finditer(r"(?:\+\+|--)\s*" + target, code):
            found.append(f"assigns to another module's object: {where(m.start())}")
        merged = r"\bObject\.(?:assign|defineProperty)\(\s*" + re.escape(who) + r"\b(?!\s*\()"
        for m in re.finditer(merged, code):
            found.append(f"assigns to another module's object: {where(m.start())}")
    for m in re.finditer(r"\.\s*hooks\s*\.\s*" + _IDENT + _ASSIGN, code):
        found.append(f"replaces a hook of another object: {where(m.start())}")
    for m in re.finditer(r"\.\s*prototype\s*\.\s*" + _IDENT + _ASSIGN, code):
        found.append(f"patches a class: {where(m.start())}")
    if name != REQUEST_LAYER:
        request = r"(?<![\w$])(?:fetch\s*\(|XMLHttpRequest\b|EventSource\b|sendBeacon\b)"
        for m in re.finditer(request, code):
            found.append(f"a request outside {REQUEST_LAYER}: {where(m.start())}")
    return found


def modules() -> list[Path]:
    return sorted(STATIC.glob("*.js"))


def test_the_front_end_exists() -> None:
    names = {p.name for p in modules()}
    assert {"store.js", REQUEST_LAYER, "main.js", "notes.js", "share.js"} <= names


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.name)
def test_no_module_changes_another_modules_objects_or_fetches(path: Path) -> None:
    assert violations(path.name, path.read_text(encoding="utf-8")) == []


def test_notes_do_not_poll() -> None:
    """notes.js follows the store's topics; a timer that re-checks the state is a poll."""
    code = code_only((STATIC / "notes.js").read_text(encoding="utf-8"))
    assert "setInterval" not in code


# ---- the scan catches what the front end once held ----------------------------------------

PAST = {
    # notes.js and share.js before the store: methods of the panes replaced
    "notes.js": """
import { getJSON } from "./api.js";
export function startNotes(h) {
  const { tree, trace, source } = h;
  const refresh = trace.refresh.bind(trace);
  trace.refresh = async (...a) => { const r = await refresh(...a); markTrace(); return r; };
  const render = source.render.bind(source);
  source.render = (doc) => { render(doc); markSource(); };
  tree.draw = () => {};
}
""",
    "share.js": """
import { state, saveToUrl } from "./state.js";
function startShare(h) {
  hooks = h;
  hooks.tree.hooks.onSelect = (e) => {};
  state.filters = [];
}
""",
    "main.js": """
import { TraceView } from "./trace.js";
const trace = new TraceView(() => {});
trace.onShowNode = async (key) => {};
""",
    "compare.js": """
const resp = await fetch("/api/compare", { method: "POST" });
""",
    "sync.js": """
function redrawNow() {
  const { tree, trace } = hooks;
  tree.generation++;
  trace.win = trace.clamp({});
}
""",
}


@pytest.mark.parametrize("name", sorted(PAST))
def test_the_scan_catches_the_old_patterns(name: str) -> None:
    found = violations(name, PAST[name])
    want = {"notes.js": 3, "share.js": 2, "main.js": 1, "compare.js": 1, "sync.js": 2}[name]
    assert len(found) >= want, found


def test_the_scan_ignores_strings_comments_and_dom_handlers() -> None:
    src = """
// trace.refresh = () => {} in a comment, and fetch( in one too
import { api } from "./api.js";
const s = "tree.draw = 1; fetch(x)";
const re = /fetch\\(/;
const b = document.createElement("button");
b.onclick = () => api.databases();
const t = `${"a"} fetch(`;
"""
    assert violations("x.js", src) == []
