/* Included after Python.h by the extensions (setup.py builds each against the limited API of
 * CPython 3.10: one abi3 wheel for 3.10 and newer), which lacks the buffer protocol: it joined the
 * limited API in 3.11, when PEP 3118's Py_buffer, unchanged since 3.3, was declared stable as it
 * was. CPython 3.10 exports the same functions with the same struct, so they are declared here,
 * as 3.11's pybuffer.h declares them. */
#ifndef SHARDFS_PYBUFFER310_H
#define SHARDFS_PYBUFFER310_H
#if defined(Py_LIMITED_API) && Py_LIMITED_API + 0 < 0x030B0000
typedef struct {
    void *buf;
    PyObject *obj;
    Py_ssize_t len, itemsize;
    int readonly, ndim;
    char *format;
    Py_ssize_t *shape, *strides, *suboffsets;
    void *internal;
} Py_buffer;
#define PyBUF_SIMPLE 0
#define PyBUF_WRITABLE 0x0001
#define PyBUF_C_CONTIGUOUS 0x0038 /* PyBUF_ND | PyBUF_STRIDES | 0x0020 */
PyAPI_FUNC(int) PyObject_GetBuffer(PyObject *obj, Py_buffer *view, int flags);
PyAPI_FUNC(void) PyBuffer_Release(Py_buffer *view);
#endif
#endif
