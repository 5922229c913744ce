"""The structure XML reader on damaged input: a :class:`CallpathError` naming the file, or a
structure — never another exception. Seeds are real files: hpcstruct's, and ours with call
sites."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from callpath.errors import CallpathError
from callpath.formats.hpcstruct import read_hpcstruct, write_hpcstruct_file
from callpath.structure.binary import analyze_binary
from conftest import shared_path

_SEEDS: dict[str, bytes] = {}


def _seeds(tmp: Path) -> list[bytes]:
    if not _SEEDS:
        name = "recursion-x86_64-gcc12-0"
        _SEEDS["theirs"] = shared_path("hpctoolkit", "struct", f"{name}.hpcstruct").read_bytes()
        ours = tmp / "ours.hpcstruct"
        write_hpcstruct_file([analyze_binary(shared_path("hpctoolkit", "bin", name))], ours)
        _SEEDS["ours"] = ours.read_bytes()
        assert b"<C " in _SEEDS["ours"]
    return list(_SEEDS.values())


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 1), edits=st.lists(
    st.tuples(st.floats(0, 1), st.integers(0, 40), st.binary(max_size=12)), max_size=4))
def test_damaged_structure_files(tmp_path: Path, which: int,
                                 edits: list[tuple[float, int, bytes]]) -> None:
    data = bytearray(_seeds(tmp_path)[which])
    for where, cut, blob in edits:
        at = int(where * len(data))
        data[at:at + cut] = blob
    p = tmp_path / "damaged.hpcstruct"
    p.write_bytes(bytes(data))
    try:
        structs = read_hpcstruct(p)
    except CallpathError as e:
        assert "damaged.hpcstruct" in str(e)
        return
    for s in structs:
        s.lookup([0x1000, 0x1139])  # the address map of whatever was read is usable


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(attr="t", value="-1")
@example(attr="t", value="0x1ffffffffffffffff")
@example(attr="l", value="99999999999")
@example(attr="v", value="{[0x0-0x1ffffffffffffffff)}")
@given(attr=st.sampled_from(["l", "t", "v", "i"]),
       value=st.text(alphabet="0x-[]{}() 9af,", max_size=12))
def test_bad_call_site_attributes(tmp_path: Path, attr: str, value: str) -> None:
    from xml.sax.saxutils import quoteattr
    attrs = {"i": "5", "l": "7", "v": "{[0x10-0x15)}", "t": "0x40"}
    attrs[attr] = value
    text = " ".join(f"{k}={quoteattr(v)}" for k, v in attrs.items())
    p = tmp_path / "c.hpcstruct"
    p.write_text(f'<HPCToolkitStructure i="0" version="4.9"><LM i="1" n="m" has-calls="1">'
                 f'<F i="2" n="f.c"><P i="3" n="p" l="1" v="{{[0x10-0x11)}}">'
                 f"<C {text}/></P></F></LM></HPCToolkitStructure>")
    try:
        (s,) = read_hpcstruct(p)
    except CallpathError as e:
        assert "c.hpcstruct" in str(e)
        return
    assert s.has_calls
