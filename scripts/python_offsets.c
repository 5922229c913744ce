/* Print, as one JSON object, the offsets of CPython's internal structures that
 * callpath.measure.remote_python reads from another process's memory (x86-64).
 * Build against one interpreter's headers (internal ones included), e.g.:
 *   gcc -DPy_BUILD_CORE -I$(python3.12 -c 'import sysconfig;print(sysconfig.get_paths()["include"])') \
 *       -I.../include/python3.12/internal scripts/python_offsets.c -o /tmp/off && /tmp/off
 * and paste the result into remote_python.OFFSETS (scripts/python_offsets.sh does all three). */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include "pycore_runtime.h"
#include "pycore_interp.h"
#include "pycore_frame.h"

#define O(name, expr) printf("%s\"%s\": %zu", first ? "" : ", ", name, (size_t)(expr)), first = 0

int main(void) {
    int first = 1;
    printf("{");
    O("runtime_interpreters_head", offsetof(_PyRuntimeState, interpreters.head));
    O("interp_next", offsetof(PyInterpreterState, next));
    O("interp_threads_head", offsetof(PyInterpreterState, threads.head));
    O("tstate_next", offsetof(PyThreadState, next));
    O("tstate_thread_id", offsetof(PyThreadState, thread_id));
    O("tstate_native_thread_id", offsetof(PyThreadState, native_thread_id));
#if PY_VERSION_HEX >= 0x030D0000
    O("tstate_current_frame", offsetof(PyThreadState, current_frame));
    O("frame_code", offsetof(_PyInterpreterFrame, f_executable));
    O("frame_instr", offsetof(_PyInterpreterFrame, instr_ptr));
#else
    O("tstate_cframe", offsetof(PyThreadState, cframe));
    O("cframe_current_frame", offsetof(_PyCFrame, current_frame));
    O("frame_code", offsetof(_PyInterpreterFrame, f_code));
    O("frame_instr", offsetof(_PyInterpreterFrame, prev_instr));
#endif
    O("frame_previous", offsetof(_PyInterpreterFrame, previous));
    O("frame_owner", offsetof(_PyInterpreterFrame, owner));
    O("code_filename", offsetof(PyCodeObject, co_filename));
    O("code_qualname", offsetof(PyCodeObject, co_qualname));
    O("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
    O("code_linetable", offsetof(PyCodeObject, co_linetable));
    O("code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
    O("unicode_length", offsetof(PyASCIIObject, length));
    O("unicode_state", offsetof(PyASCIIObject, state));
    O("unicode_ascii_size", sizeof(PyASCIIObject));
    O("unicode_compact_size", sizeof(PyCompactUnicodeObject));
    O("bytes_size", offsetof(PyVarObject, ob_size));
    O("bytes_data", offsetof(PyBytesObject, ob_sval));
    O("object_type", offsetof(PyObject, ob_type));
    printf("}\n");
    return 0;
}
