"""Native measurement (``callpath run``): perf_event sampling through ctypes, ring buffers,
sample decoding, post-mortem call-stack unwinding with CFI, and the quick flat summary.

Modules: ``events`` (names → perf_event_attr), ``perf`` (the system call, ring buffers),
``launch`` (fork/exec gate, signal forwarding, draining), ``records`` (decoding perf records),
``elfinfo`` (load-module facts: build-ids, segments, CFI, symbols), ``cfi`` (compiled CFI
rows), ``unwind`` (vectorised unwinder), ``postmortem`` (raw data → trees → measurement
directory), ``summary`` (the closing paragraph and flat profile).
"""
