"""Types of the C decoder (``_callpath_decode.c``), used by :mod:`callpath.structure.cfg`."""

def decode(buf: bytes, start: int, ip: int, ips: list[int], ends: list[int],
           kinds: list[int], targets: list[int], flows: list[int], /) -> int: ...
