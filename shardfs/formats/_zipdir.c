/* Zip directories' fast path (formats/zipdir.py, zip.py): the loops over every member that numpy
 * could only do in many passes over index arrays (measured at a million members: 0.7 s of a 1.5 s
 * scan).
 *
 * walk(cd, count): where each central directory entry starts (each one's three lengths give the
 *   next) and the names back to back: (starts, names, name_ends), int64 arrays as bytes. ValueError
 *   where the directory ends before its count of entries.
 * records(data, starts, size): the records of `size` bytes at each of `starts` (int64) of data, back
 *   to back (numpy's fancy indexing took an index per byte); ValueError where one runs past the end.
 * same_bytes(a, a_at, b, b_at, lengths): for each i, 1 where a[a_at[i]:][:lengths[i]] equals
 *   b[b_at[i]:][:lengths[i]], else 0 (a local header's name against its central entry's); a range
 *   past either end is 0.
 * normal_forms(names, rows): each row's normal form (_names.h), its path hash, its parent's end and
 *   hash, written into rows (NFIELDS int64 a row, F_NAME_END given), as the tar scanner fills
 *   them for headers; returns the hashes of the folders above the parents (uint64). A name with a
 *   NUL byte is NOT_NORMAL (index/replay.py refuses it).
 * Each runs without the GIL on buffers the call holds.
 *
 * Limited API (3.10): one abi3 build serves every Python from 3.10. */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../pybuffer310.h"
#include "_names.h"

enum { CENTRAL_SIZE = 46, NAME_LEN_AT = 28 };

static inline uint16_t le16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* Buffers a call holds: released together, whatever was got. */
typedef struct {
    Py_buffer views[5];
    int got;
} Held;

static int hold(Held *h, PyObject *obj, int writable) {
    if (PyObject_GetBuffer(obj, &h->views[h->got], writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0)
        return -1;
    h->got++;
    return 0;
}

static void release(Held *h) {
    while (h->got)
        PyBuffer_Release(&h->views[--h->got]);
}

/* The entries of cd, followed from the first: -1 (*cut_at: the entry) where one runs past the end. */
static int walk_entries(const unsigned char *cd, size_t len, size_t count, int64_t *starts, int64_t *name_ends,
                        Buf *names, size_t *cut_at) {
    size_t pos = 0;
    for (size_t i = 0; i < count; i++) {
        if (pos + CENTRAL_SIZE > len) {
            *cut_at = i;
            return -1;
        }
        const unsigned char *e = cd + pos;
        size_t n = le16(e + NAME_LEN_AT), extra = le16(e + NAME_LEN_AT + 2), comment = le16(e + NAME_LEN_AT + 4);
        if (pos + CENTRAL_SIZE + n > len) {
            *cut_at = i;
            return -1;
        }
        starts[i] = (int64_t)pos;
        if (buf_add(names, e + CENTRAL_SIZE, n) < 0)
            return -2;
        name_ends[i] = (int64_t)names->len;
        pos += CENTRAL_SIZE + n + extra + comment;
    }
    if (pos > len) {
        *cut_at = count - 1;
        return -1;
    }
    return 0;
}

static PyObject *walk(PyObject *self, PyObject *args) {
    PyObject *cd_obj;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "On", &cd_obj, &count))
        return NULL;
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "a negative count");
        return NULL;
    }
    Held held = {0};
    if (hold(&held, cd_obj, 0) < 0)
        return NULL;
    const Py_buffer *cd = &held.views[0];
    /* at most one entry per CENTRAL_SIZE bytes: a count beyond that is cut off, found before any room is taken */
    if ((size_t)count > (size_t)cd->len / CENTRAL_SIZE) {
        release(&held);
        return PyErr_Format(PyExc_ValueError, "central directory cut off at entry %zd of %zd",
                            cd->len / CENTRAL_SIZE, count);
    }
    size_t room = count ? (size_t)count : 1;
    int64_t *starts = malloc(room * sizeof *starts), *ends = malloc(room * sizeof *ends);
    Buf names = {0};
    size_t cut_at = 0;
    int status = -2;
    if (starts && ends) {
        Py_BEGIN_ALLOW_THREADS
        status = walk_entries(cd->buf, (size_t)cd->len, (size_t)count, starts, ends, &names, &cut_at);
        Py_END_ALLOW_THREADS
    }
    release(&held);
    PyObject *result = NULL;
    if (status == -2)
        PyErr_NoMemory();
    else if (status == -1)
        PyErr_Format(PyExc_ValueError, "central directory cut off at entry %zu of %zd", cut_at, count);
    else
        result = Py_BuildValue("(y#y#y#)", (char *)starts, (Py_ssize_t)(count * 8), names.data ? names.data : "",
                               (Py_ssize_t)names.len, (char *)ends, (Py_ssize_t)(count * 8));
    free(starts);
    free(ends);
    free(names.data);
    return result;
}

static PyObject *records(PyObject *self, PyObject *args) {
    PyObject *data_obj, *starts_obj;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "OOn", &data_obj, &starts_obj, &size))
        return NULL;
    Held held = {0};
    if (hold(&held, data_obj, 0) < 0 || hold(&held, starts_obj, 0) < 0) {
        release(&held);
        return NULL;
    }
    const Py_buffer *data = &held.views[0], *starts = &held.views[1];
    Py_ssize_t n = starts->len / 8;
    PyObject *out = NULL;
    if (starts->len % 8 || size < 0 || (size && n > PY_SSIZE_T_MAX / size))
        PyErr_SetString(PyExc_ValueError, "starts: an int64 array; size: a record's bytes");
    else if ((out = PyBytes_FromStringAndSize(NULL, n * size)) != NULL) {
        char *to = PyBytes_AsString(out);
        const int64_t *at = starts->buf;
        Py_ssize_t bad = -1;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n && bad < 0; i++) {
            if (at[i] < 0 || size > data->len || at[i] > data->len - size)
                bad = i;
            else
                memcpy(to + i * size, (const char *)data->buf + at[i], (size_t)size);
        }
        Py_END_ALLOW_THREADS
        if (bad >= 0) {
            Py_CLEAR(out);
            PyErr_Format(PyExc_ValueError, "record %zd runs past the end", bad);
        }
    }
    release(&held);
    return out;
}

static PyObject *same_bytes(PyObject *self, PyObject *args) {
    PyObject *objs[5];
    if (!PyArg_ParseTuple(args, "OOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4]))
        return NULL;
    Held held = {0};
    for (int i = 0; i < 5; i++)
        if (hold(&held, objs[i], 0) < 0) {
            release(&held);
            return NULL;
        }
    const Py_buffer *a = &held.views[0], *a_at = &held.views[1], *b = &held.views[2], *b_at = &held.views[3],
                    *lengths = &held.views[4];
    Py_ssize_t n = lengths->len / 8;
    if (lengths->len % 8 || a_at->len != lengths->len || b_at->len != lengths->len) {
        release(&held);
        PyErr_SetString(PyExc_ValueError, "offsets and lengths: int64 arrays of one length");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    if (out != NULL) {
        unsigned char *same = (unsigned char *)PyBytes_AsString(out);
        const int64_t *ao = a_at->buf, *bo = b_at->buf, *len = lengths->buf;
        const unsigned char *ab = a->buf, *bb = b->buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            int inside = len[i] >= 0 && ao[i] >= 0 && bo[i] >= 0 && len[i] <= a->len && len[i] <= b->len &&
                         ao[i] <= a->len - len[i] && bo[i] <= b->len - len[i];
            same[i] = inside && memcmp(ab + ao[i], bb + bo[i], (size_t)len[i]) == 0;
        }
        Py_END_ALLOW_THREADS
    }
    release(&held);
    return out;
}

/* Fills the normal-form fields of rows (see the top), as _tarscan.c's add_member does; -1 where a
 * name end goes back or past the names, -2 if out of memory. */
static int fill_normal_forms(const unsigned char *names, size_t len, int64_t *rows, size_t n, Buf *above) {
    Parents parents;
    memset(&parents, 0, sizeof parents);
    int64_t begin = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t *row = rows + i * NFIELDS, end = row[F_NAME_END];
        if (end < begin || end > (int64_t)len)
            return -1;
        if (fill_name_fields(&parents, (const char *)names, above, names + begin, (size_t)(end - begin), row) < 0)
            return -2;
        begin = end;
    }
    return 0;
}

static PyObject *normal_forms(PyObject *self, PyObject *args) {
    PyObject *names_obj, *rows_obj;
    if (!PyArg_ParseTuple(args, "OO", &names_obj, &rows_obj))
        return NULL;
    Held held = {0};
    if (hold(&held, names_obj, 0) < 0 || hold(&held, rows_obj, 1) < 0) {
        release(&held);
        return NULL;
    }
    const Py_buffer *names = &held.views[0], *rows = &held.views[1];
    if (rows->len % (NFIELDS * 8)) {
        release(&held);
        PyErr_SetString(PyExc_ValueError, "rows of NFIELDS int64");
        return NULL;
    }
    Buf above = {0};
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = fill_normal_forms(names->buf, (size_t)names->len, rows->buf, (size_t)rows->len / (NFIELDS * 8), &above);
    Py_END_ALLOW_THREADS
    release(&held);
    PyObject *result = NULL;
    if (status == -2)
        PyErr_NoMemory();
    else if (status == -1)
        PyErr_SetString(PyExc_ValueError, "a name end goes back or past the names");
    else
        result = PyBytes_FromStringAndSize(above.data ? above.data : "", (Py_ssize_t)above.len);
    free(above.data);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, "The central directory's entries: (starts, names, name_ends)."},
    {"records", records, METH_VARARGS, "The records of `size` bytes at each of `starts`, back to back."},
    {"same_bytes", same_bytes, METH_VARARGS, "For each i, whether two byte ranges are equal (uint8 a range)."},
    {"normal_forms", normal_forms, METH_VARARGS, "Fill rows' normal forms, hashes and parents; the folders above."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_zipdir", NULL, -1, methods};

PyMODINIT_FUNC PyInit__zipdir(void) { return PyModule_Create(&module); }
