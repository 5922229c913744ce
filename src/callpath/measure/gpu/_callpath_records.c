/* Where each record of a raw file of callpath's CUPTI library lies (convert.py).
 *
 * The raw file is a sequence of records, each a little-endian u32 tag and u32 payload length,
 * then the payload. Records have different lengths, so finding them is a sequential walk:
 * in Python it cost about a microsecond a record, two records a launch (the launch and its
 * kernel), which made a long training run's conversion take seconds. Here it is the walk
 * only; convert.py reads the records' fields as arrays. Optional: without it convert.py walks
 * in Python (same records). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* scan(buffer) -> (bytes, end): for each whole record three native int64s (its tag, the
 * offset of its payload, the payload's length), and the offset after the last whole record
 * (short of the buffer's length where a killed process left a record cut off). */
static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view)) return NULL;
    const uint8_t *p = view.buf;
    uint64_t n = (uint64_t)view.len, pos = 0;
    Py_ssize_t count = 0;
    while (pos + 8 <= n) {
        uint32_t len;
        memcpy(&len, p + pos + 4, 4);
        if (pos + 8 + len > n) break;
        pos += 8 + (uint64_t)len;
        count++;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, count * 3 * (Py_ssize_t)sizeof(int64_t));
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int64_t *o = (int64_t *)PyBytes_AS_STRING(out);
    pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint32_t head[2];
        memcpy(head, p + pos, 8);
        o[3 * i] = head[0];
        o[3 * i + 1] = (int64_t)pos + 8;
        o[3 * i + 2] = head[1];
        pos += 8 + (uint64_t)head[1];
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(NK)", out, (unsigned long long)pos);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Tag, payload offset and length of each whole record."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_callpath_records",
                                    "Where the records of a CUPTI library's raw file lie.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__callpath_records(void) { return PyModule_Create(&module); }
