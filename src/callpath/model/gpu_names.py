"""GPU operations as HPCToolkit names them: placeholder contexts and metric descriptors.

Plain data shared by the attribution of HPCToolkit's GPU measurements (``hpcrun -e gpu=...``,
:mod:`callpath.attribute.hpctk`) and callpath's own GPU capture, so that both give the names,
descriptions and semantics that hpcprof writes (checked against hpcprof's database of
HPCToolkit's ``loops-cuda-nvidia-t`` test measurement, tests/test_prof_hpctoolkit_gpu.py).
The values are read from HPCToolkit's measurements and databases and its documentation
(``doc/src/users/gpu/gpu.md``); docs/prof.md explains the rules.
"""

from __future__ import annotations

#: hpcrun's placeholder frames (load module 0): the 8-byte code stored as the frame's address
#: (big-endian ASCII) → the name hpcprof gives the context. hpcprof makes each one a
#: function context of its own, reached by a call, under the call site of the API call that
#: launched the operation; two codes with one name (``GPUKernl`` and ``GPUTrace``) are still
#: two different contexts (hpcrun attributes a kernel's metrics below the first and its
#: stream's trace samples below the second).
GPU_PLACEHOLDERS: dict[bytes, str] = {
    b"GPUCp?2?": "<gpu copy>",
    b"GPUCpH2D": "<gpu copyin>",
    b"GPUCpD2H": "<gpu copyout>",
    b"GPUAlloc": "<gpu alloc>",
    b"GPUDelte": "<gpu delete>",
    b"GPUKernl": "<gpu kernel>",
    b"GPUMemst": "<gpu memset>",
    b"GPU Sync": "<gpu sync>",
    b"GPUTrace": "<gpu kernel>",
}

#: The other named placeholders hpcprof knows (OpenMP states and target operations).
OTHER_PLACEHOLDERS: dict[bytes, str] = {
    b"OMP Idle": "<omp idle>",
    b"OMPOvrHd": "<omp overhead>",
    b"OMPBarrW": "<omp barrier wait>",
    b"OMPTaskW": "<omp task wait>",
    b"OMPMtexW": "<omp mutex wait>",
    b"OMP Work": "<omp work>",
    b"OMPETask": "<omp expl task>",
    b"OMPITask": "<omp impl task>",
    b"OMTAlloc": "<omp tgt alloc>",
    b"OMTDelte": "<omp tgt delete>",
    b"OMTCpIn ": "<omp tgt copyin>",
    b"OMTCpOut": "<omp tgt copyout>",
    b"OMTKernl": "<omp tgt kernel>",
    b"OMPUresv": "<omp region unresolved>",
}

#: hpcrun's ``show`` flag of a metric descriptor: how hpcprof presents the metric.
SHOW_HIDE, SHOW, SHOW_INCLUSIVE, SHOW_EXCLUSIVE, SHOW_INVISIBLE = 0, 1, 2, 3, 4

#: The measured GPU metrics of ``hpcrun -e gpu=nvidia`` in hpcrun's order:
#: (name, description, integer values, show flag, attributed to the procedure).
#: "Attributed to the procedure" is hpcrun's ``move2proc`` flag: hpcprof adds such a value
#: to the function context the frame's call enters (for a kernel, the kernel's function
#: below ``<gpu kernel>``), not to the instruction's line; times, counts and kernel
#: properties are, bytes of copies and allocations are not.
GPU_METRICS: tuple[tuple[str, str, bool, int, bool], ...] = (
    ("GPUOP (sec)", "GPU time: all operations (seconds)", False, SHOW, True),
    ("GKER (sec)", "GPU time: kernel execution (seconds)", False, SHOW, True),
    ("GMEM (sec)", "GPU time: memory allocation/deallocation (seconds)", False, SHOW, True),
    ("GMSET (sec)", "GPU time: memory set (seconds)", False, SHOW, True),
    ("GXCOPY (sec)", "GPU time: explicit data copy (seconds)", False, SHOW, True),
    ("GICOPY (sec)", "GPU time: implicit data copy (seconds)", False, SHOW, True),
    ("GSYNC (sec)", "GPU time: synchronization (seconds)", False, SHOW, True),
    ("GMEM:UNK (B)", "GPU memory alloc/free: unknown memory kind (bytes)", True, SHOW, False),
    ("GMEM:PAG (B)", "GPU memory alloc/free: pageable memory (bytes)", True, SHOW, False),
    ("GMEM:PIN (B)", "GPU memory alloc/free: pinned memory (bytes)", True, SHOW, False),
    ("GMEM:DEV (B)", "GPU memory alloc/free: device memory (bytes)", True, SHOW, False),
    ("GMEM:ARY (B)", "GPU memory alloc/free: array memory (bytes)", True, SHOW, False),
    ("GMEM:MAN (B)", "GPU memory alloc/free: managed memory (bytes)", True, SHOW, False),
    ("GMEM:DST (B)", "GPU memory alloc/free: device static memory (bytes)", True, SHOW, False),
    ("GMEM:MST (B)", "GPU memory alloc/free: managed static memory (bytes)", True, SHOW,
     False),
    ("GMEM:COUNT", "GPU memory alloc/free: count", True, SHOW, False),
    ("GMSET:UNK (B)", "GPU memory set: unknown memory kind (bytes)", True, SHOW, False),
    ("GMSET:PAG (B)", "GPU memory set: pageable memory (bytes)", True, SHOW, False),
    ("GMSET:PIN (B)", "GPU memory set: pinned memory (bytes)", True, SHOW, False),
    ("GMSET:DEV (B)", "GPU memory set: device memory (bytes)", True, SHOW, False),
    ("GMSET:ARY (B)", "GPU memory set: array memory (bytes)", True, SHOW, False),
    ("GMSET:MAN (B)", "GPU memory set: managed memory (bytes)", True, SHOW, False),
    ("GMSET:DST (B)", "GPU memory set: device static memory (bytes)", True, SHOW, False),
    ("GMSET:MST (B)", "GPU memory set: managed static memory (bytes)", True, SHOW, False),
    ("GMSET:COUNT", "GPU memory set: count", True, SHOW, False),
    ("GXCOPY:UNK (B)", "GPU explicit memory copy: unknown kind (bytes)", True, SHOW, False),
    ("GXCOPY:H2D (B)", "GPU explicit memory copy: host to device (bytes)", True, SHOW, False),
    ("GXCOPY:D2H (B)", "GPU explicit memory copy: device to host (bytes)", True, SHOW, False),
    ("GXCOPY:H2A (B)", "GPU explicit memory copy: host to array (bytes)", True, SHOW, False),
    ("GXCOPY:A2H (B)", "GPU explicit memory copy: array to host (bytes)", True, SHOW, False),
    ("GXCOPY:A2A (B)", "GPU explicit memory copy: array to array (bytes)", True, SHOW, False),
    ("GXCOPY:A2D (B)", "GPU explicit memory copy: array to device (bytes)", True, SHOW, False),
    ("GXCOPY:D2A (B)", "GPU explicit memory copy: device to array (bytes)", True, SHOW, False),
    ("GXCOPY:D2D (B)", "GPU explicit memory copy: device to device (bytes)", True, SHOW,
     False),
    ("GXCOPY:H2H (B)", "GPU explicit memory copy: host to host (bytes)", True, SHOW, False),
    ("GXCOPY:P2P (B)", "GPU explicit memory copy: peer to peer (bytes)", True, SHOW, False),
    ("GXCOPY:COUNT", "GPU explicit memory copy: count", True, SHOW, False),
    ("GSYNC:UNK (sec)", "GPU synchronizations: unknown kind", False, SHOW_HIDE, False),
    ("GSYNC:EVT (sec)", "GPU synchronizations: event", False, SHOW_HIDE, False),
    ("GSYNC:STRE (sec)", "GPU synchronizations: stream event wait", False, SHOW_HIDE, False),
    ("GSYNC:STR (sec)", "GPU synchronizations: stream", False, SHOW_HIDE, False),
    ("GSYNC:CTX (sec)", "GPU synchronizations: context", False, SHOW_HIDE, False),
    ("GSYNC:COUNT", "GPU synchronizations: count", False, SHOW_HIDE, False),
    ("GKER:STMEM_ACUMU (B)", "GPU kernel: static memory accumulator [internal use only]",
     True, SHOW_INVISIBLE, True),
    ("GKER:DYMEM_ACUMU (B)", "GPU kernel: dynamic memory accumulator [internal use only]",
     True, SHOW_INVISIBLE, True),
    ("GKER:LMEM_ACUMU (B)", "GPU kernel: local memory accumulator [internal use only]",
     True, SHOW_INVISIBLE, True),
    ("GKER:FGP_ACT_ACUMU", "GPU kernel: fine-grain parallelism accumulator [internal use only]",
     True, SHOW_INVISIBLE, True),
    ("GKER:FGP_MAX_ACUMU", "GPU kernel: fine-grain parallelism accumulator [internal use only]",
     True, SHOW_INVISIBLE, True),
    ("GKER:THR_REG_ACUMU", "GPU kernel: thread register count accumulator [internal use only]",
     True, SHOW_INVISIBLE, True),
    ("GKER:BLK_THR_ACUMU", "GPU kernel: thread count accumulator [internal use only]",
     True, SHOW_INVISIBLE, True),
    ("GKER:BLK_SM_ACUMU", "GPU kernel: block local memory accumulator [internal use only]",
     True, SHOW_INVISIBLE, True),
    ("GKER:BLKS_ACUMU", "GPU kernel: block count accumulator [internal use only]",
     True, SHOW_INVISIBLE, True),
    ("GKER:COUNT", "GPU kernel: launch count", True, SHOW, True),
)

#: The kernel properties hpcrun describes by a formula over the accumulators (hpcprof makes
#: them derived statistics of ``metrics/default.yaml``, exclusive only, not metrics of
#: ``meta.db``): (name, description, formula over metric names, printf format).
GPU_DERIVED: tuple[tuple[str, str, str, str], ...] = (
    ("GKER:STMEM (B)", "GPU kernel: static memory (bytes)",
     "GKER:STMEM_ACUMU (B) / GKER:COUNT", "%6.0f"),
    ("GKER:DYMEM (B)", "GPU kernel: dynamic memory (bytes)",
     "GKER:DYMEM_ACUMU (B) / GKER:COUNT", "%6.0f"),
    ("GKER:LMEM (B)", "GPU kernel: local memory (bytes)",
     "GKER:LMEM_ACUMU (B) / GKER:COUNT", "%6.0f"),
    ("GKER:FGP_ACT", "GPU kernel: fine-grain parallelism, actual",
     "GKER:FGP_ACT_ACUMU / GKER:COUNT", "%6.0f"),
    ("GKER:FGP_MAX", "GPU kernel: fine-grain parallelism, maximum",
     "GKER:FGP_MAX_ACUMU / GKER:COUNT", "%6.0f"),
    ("GKER:THR_REG", "GPU kernel: thread register count",
     "GKER:THR_REG_ACUMU / GKER:COUNT", "%6.0f"),
    ("GKER:BLK_THR", "GPU kernel: thread count", "GKER:BLK_THR_ACUMU / GKER:COUNT", "%6.0f"),
    ("GKER:BLK_SM (B)", "GPU kernel: block local memory (bytes)",
     "GKER:BLK_SM_ACUMU / GKER:COUNT", "%6.0f"),
    ("GKER:BLKS", "GPU kernel: block count", "GKER:BLKS_ACUMU / GKER:COUNT", "%6.0f"),
    ("GKER:OCC_THR", "GPU kernel: theoretical occupancy (FGP_ACT / FGP_MAX)",
     "100 * (GKER:FGP_ACT_ACUMU / GKER:FGP_MAX_ACUMU)", "%6.2f %%"),
)

# ---- callpath's own GPU capture (callpath run -e gpu=nvidia; callpath.attribute.gpu_ops) ----

#: Kinds of a recorded GPU operation (the ``kind`` field of GPUOPS records,
#: callpath.formats.measdir_gpu).
OP_KERNEL = 1
OP_MEMCPY = 2
OP_MEMSET = 3
OP_SYNC = 4
OP_ALLOC = 5  # a memory allocation (cudaMalloc ...), timed by its API call
OP_FREE = 6   # a memory free (cudaFree ...), timed by its API call

#: The placeholder procedures under the launching call, as hpcprof names hpcrun's.
PLACEHOLDER_KERNEL = GPU_PLACEHOLDERS[b"GPUKernl"]
PLACEHOLDER_COPYIN = GPU_PLACEHOLDERS[b"GPUCpH2D"]    # host to device
PLACEHOLDER_COPYOUT = GPU_PLACEHOLDERS[b"GPUCpD2H"]   # device to host
PLACEHOLDER_COPY = GPU_PLACEHOLDERS[b"GPUCp?2?"]      # any other direction
PLACEHOLDER_MEMSET = GPU_PLACEHOLDERS[b"GPUMemst"]
PLACEHOLDER_SYNC = GPU_PLACEHOLDERS[b"GPU Sync"]
PLACEHOLDER_ALLOC = GPU_PLACEHOLDERS[b"GPUAlloc"]
PLACEHOLDER_FREE = GPU_PLACEHOLDERS[b"GPUDelte"]

#: CUPTI's CUpti_ActivityMemcpyKind -> the GXCOPY suffix.
COPY_KINDS = {0: "UNK", 1: "H2D", 2: "D2H", 3: "H2A", 4: "A2H", 5: "A2A", 6: "A2D", 7: "D2A",
              8: "D2D", 9: "H2H", 10: "P2P"}
#: CUPTI's CUpti_ActivityMemoryKind -> the GMSET / GMEM suffix.
MEMORY_KINDS = {0: "UNK", 1: "PAG", 2: "PIN", 3: "DEV", 4: "ARY", 5: "MAN", 6: "DST", 7: "MST"}
#: CUPTI's CUpti_ActivitySynchronizationType -> the GSYNC suffix.
SYNC_KINDS = {0: "UNK", 1: "EVT", 2: "STRE", 3: "STR", 4: "CTX"}

#: (name, description) of the GPU metrics of a callpath measurement, hpcrun's, in its order.
METRICS: list[tuple[str, str]] = [(name, desc) for name, desc, *_ in GPU_METRICS]
METRIC_INDEX = {name: i for i, (name, _) in enumerate(METRICS)}
