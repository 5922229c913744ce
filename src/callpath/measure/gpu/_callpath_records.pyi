"""Types of the raw-record scanner (``_callpath_records.c``), used by
:mod:`callpath.measure.gpu.convert`."""

from mmap import mmap

def scan(data: bytes | mmap, /) -> tuple[bytes, int]: ...
