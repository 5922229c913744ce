"""Native measurement (``callpath run``): perf_event sampling through ctypes, ring buffers,
sample decoding, post-mortem call-stack unwinding with CFI, and the quick flat summary.

Modules: ``events`` (names → perf_event_attr), ``perf`` (the system call, ring buffers),
``launch`` (fork/exec gate, signal forwarding, draining), ``records`` (decoding perf records),
``elfinfo`` (load-module facts: build-ids, segments, symbols), ``cfi`` (compiled CFI rows),
``unwind`` (vectorised unwinder), ``cctbuild`` (paths → trees), ``postmortem`` (raw → measdir),
``flat`` (top procedures).
"""
