"""Types of the C decoder (``_callpath_decode.c``), used by :mod:`callpath.structure.cfg`."""

from collections.abc import Callable

def decode(buf: bytes, start: int, ip: int, ips: list[int], ends: list[int],
           kinds: list[int], targets: list[int], flows: list[int], /) -> int: ...
def loops(succ: list[list[int]], entry: int, /) -> tuple[
        list[tuple[int, int, bool, list[int], list[int]]], list[int]]: ...
def cfg(ips: list[int], ends: list[int], kinds: list[int], targets: list[int],
        flow: list[int], tables: dict[int, list[int]], lo: int, hi: int,
        no_return: Callable[[int], bool] | None, memo: dict[int, bool] | None, /
        ) -> tuple[list[int], list[int], list[int], list[int], list[list[int]]]: ...
