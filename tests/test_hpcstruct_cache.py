"""The parse cache of structure files (``callpath.formats.hpcstruct``): a cached read equals a
parse, and an entry that is corrupt, truncated, stale or unwritable never changes the result
(nor raises): the file is parsed instead."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from callpath.formats import hpcstruct
from callpath.formats.hpcstruct import parse_cache_dir, read_hpcstruct
from callpath.structure.model import Structure
from conftest import shared_path

FILES = ["inlines+loops-x86_64-gcc12-0.hpcstruct", "recursion-x86_64-gcc12-dr.hpcstruct"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh cache directory, caching every file whatever its size."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(hpcstruct, "CACHE_MIN_BYTES", 0)
    return parse_cache_dir()


def _copy(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copy(shared_path("hpctoolkit", "struct", name), dst)
    return dst


def assert_same(a: list[Structure], b: list[Structure]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for k, v in vars(x).items():
            w = getattr(y, k)
            if isinstance(v, np.ndarray):
                assert v.dtype == w.dtype and np.array_equal(v, w), k
            else:
                assert v == w, k


def _entry(cache: Path) -> Path:
    (entry,) = cache.glob("*.npz")
    return entry


@pytest.mark.parametrize("name", FILES)
def test_a_cached_read_equals_the_parse(name: str, cache: Path, tmp_path: Path) -> None:
    f = _copy(name, tmp_path)
    parsed = read_hpcstruct(f, cache=False)
    assert not cache.exists()
    first = read_hpcstruct(f)  # parses, stores
    entry = _entry(cache)
    inode, stored = entry.stat().st_ino, entry.read_bytes()
    second = read_hpcstruct(f)  # from the entry
    assert entry.stat().st_ino == inode and entry.read_bytes() == stored  # read, not rewritten
    assert_same(parsed, first)
    assert_same(parsed, second)
    assert parsed[0].map_lo.size and parsed[0].strings  # a real structure, not an empty one


def test_small_files_are_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    f = _copy(FILES[0], tmp_path)
    assert f.stat().st_size < hpcstruct.CACHE_MIN_BYTES
    read_hpcstruct(f)
    assert not parse_cache_dir().exists()


def test_a_changed_file_is_parsed_again(cache: Path, tmp_path: Path) -> None:
    f = _copy(FILES[0], tmp_path)
    before = read_hpcstruct(f)
    text = f.read_text()
    # same size and modification time, other content: only the digest tells
    st = f.stat()
    changed = text.replace('l="', 'l="9', 1).replace('  ', ' ', 1)
    assert len(changed) == len(text)
    f.write_text(changed)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = read_hpcstruct(f)
    assert_same(after, read_hpcstruct(f, cache=False))
    assert not all(np.array_equal(x.line, y.line) for x, y in zip(before, after, strict=True))
    assert_same(read_hpcstruct(f), after)  # and the entry now holds the new parse


def _damaged(data: bytes, how: str, lines: bytes) -> bytes:
    if how == "truncated":
        return data[: len(data) // 2]
    if how == "empty":
        return b""
    if how == "flipped":  # a byte of the stored line numbers: only the member's CRC tells
        at = data.find(lines)
        assert at > 0
        b = bytearray(data)
        b[at + len(lines) // 2] ^= 0x5A
        return bytes(b)
    return b"not a zip file at all"


@pytest.mark.parametrize("how", ["truncated", "empty", "flipped", "garbage"])
def test_a_damaged_entry_is_parsed_and_rewritten(how: str, cache: Path, tmp_path: Path) -> None:
    f = _copy(FILES[1], tmp_path)
    parsed = read_hpcstruct(f, cache=False)
    read_hpcstruct(f)
    entry = _entry(cache)
    good = entry.read_bytes()
    entry.write_bytes(_damaged(good, how, parsed[0].line.tobytes()))
    assert_same(read_hpcstruct(f), parsed)
    assert entry.read_bytes() == good  # rewritten whole


def test_an_entry_of_another_file_is_not_taken(cache: Path, tmp_path: Path) -> None:
    """An entry put in the place of another file's (e.g. copied by hand) does not match the
    identity of this one."""
    a, b = _copy(FILES[0], tmp_path), _copy(FILES[1], tmp_path)
    read_hpcstruct(a)
    entry_a = _entry(cache)
    read_hpcstruct(b)
    entry_b = next(p for p in cache.glob("*.npz") if p != entry_a)
    shutil.copy(entry_a, entry_b)
    assert_same(read_hpcstruct(b), read_hpcstruct(b, cache=False))


def test_copies_share_one_entry_and_the_directory_stays_bounded(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every `callpath profile` run writes its structure files anew: copies of one content
    share an entry. Entries beyond the bound go, least recently used first; the newest stays."""
    for i in range(3):
        (tmp_path / f"run{i}").mkdir()
        read_hpcstruct(shutil.copy(shared_path("hpctoolkit", "struct", FILES[1]),
                                   tmp_path / f"run{i}" / FILES[1]))
    (old,) = cache.glob("*.npz")
    monkeypatch.setattr(hpcstruct, "CACHE_MAX_BYTES", old.stat().st_size + 1)
    f = _copy(FILES[0], tmp_path)
    parsed = read_hpcstruct(f)  # two entries would exceed the bound: the older goes
    (new,) = cache.glob("*.npz")
    assert new != old and not old.exists()
    assert_same(read_hpcstruct(f), parsed)


def test_an_unwritable_cache_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "xdg"
    blocker.write_text("a file where the cache directory would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setattr(hpcstruct, "CACHE_MIN_BYTES", 0)
    f = _copy(FILES[0], tmp_path)
    assert_same(read_hpcstruct(f), read_hpcstruct(f, cache=False))
    assert blocker.is_file()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzzed_entries_never_change_the_result(cache: Path, tmp_path: Path,
                                                data: st.DataObject) -> None:
    """Random damage (cut, overwritten bytes, appended bytes) to a valid entry."""
    f = tmp_path / "fuzz.hpcstruct"
    if not f.exists():
        shutil.copy(shared_path("hpctoolkit", "struct", FILES[1]), f)
    parsed = read_hpcstruct(f, cache=False)
    read_hpcstruct(f)
    entry = _entry(cache)
    good = bytearray(entry.read_bytes())
    cut = data.draw(st.integers(0, 1 << 20)) * len(good) >> 20
    pos = data.draw(st.integers(0, (1 << 20) - 1)) * len(good) >> 20
    noise = data.draw(st.binary(min_size=1, max_size=16))
    bad = good[:]
    bad[pos:pos + len(noise)] = noise
    bad = bad[:cut] if data.draw(st.booleans()) else bad + noise
    entry.write_bytes(bytes(bad))
    assert_same(read_hpcstruct(f), parsed)
