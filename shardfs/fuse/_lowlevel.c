/* The FUSE request loop of shardfs, on libfuse's low-level API.
 *
 * What every file costs is answered here, from the view's arrays and without Python: lookups,
 * attributes, listings (marked cacheable, so a second listing never reaches us), ioctl (the
 * TCGETS of every Python open()), statfs, and reads of bytes the RAM cache already holds.
 * Everything else, and every read the RAM cache cannot answer yet, goes to the Python
 * operations (shardfs.fuse.ops, the fusepy API) with the path, as before.
 *
 * Node ids are the inode numbers users see (a hash of the path, the root is 1), so a rescan
 * that swaps the view keeps every id the kernel holds pointing at the same path.
 *
 * Objects:
 *   Slot    one shard's bytes in the RAM cache, published while resident (pinned while read)
 *   Table   one view: the arrays of shardfs.view.tree plus one Slot per shard
 *   Session the mount: the libfuse session, the current Table, per-op counters
 */
#define FUSE_USE_VERSION 312
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <fuse_lowlevel.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define CHUNK_LOADED 2 /* shardfs.storage.ram.LOADED */

/* ---- Slot -------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    _Atomic(const char *) data; /* NULL while nothing is published */
    _Atomic int pins;           /* fast readers copying out of data */
    const uint8_t *state;       /* chunk states, written by the RAM cache */
    Py_ssize_t size, nchunks, chunk;
    Py_buffer databuf, statebuf;
    int published;
    _Atomic uint64_t used_ns; /* CLOCK_MONOTONIC of the last fast read */
    _Atomic uint64_t hits;
    /* The shard's file in the disk tier (storage.tierfile), read here while the RAM cache
     * has refused the shard (``direct``): chunk records of crc32s per block, checked on every read. */
    _Atomic int fd; /* the data, O_DIRECT where possible; -1 while nothing is published */
    int records_fd; /* the chunk records (small unaligned reads: never O_DIRECT) */
    _Atomic int direct;
    _Atomic int no_o_direct; /* the filesystem took the O_DIRECT open but refuses its reads */
    const uint8_t *fstate; /* chunk states of the disk tier */
    Py_buffer fstatebuf;
    int fpublished;
    uint8_t valid;
    int64_t data_at, header, record_size, block, fchunk, fsize;
    uint32_t magic;
    _Atomic uint64_t disk_hits, disk_bytes;
} Slot;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* After data or fd was cleared: a reader pins before it loads them, so once pins is 0 no
 * reader can still use what they were. */
static void wait_unpinned(Slot *s) {
    Py_BEGIN_ALLOW_THREADS
    while (atomic_load(&s->pins) != 0)
        sched_yield();
    Py_END_ALLOW_THREADS
}

static void slot_release(Slot *s) {
    if (!s->published)
        return;
    atomic_store(&s->data, NULL);
    wait_unpinned(s);
    PyBuffer_Release(&s->databuf);
    PyBuffer_Release(&s->statebuf);
    s->published = 0;
}

static void slot_release_file(Slot *s) {
    if (!s->fpublished)
        return;
    atomic_store(&s->fd, -1);
    wait_unpinned(s);
    PyBuffer_Release(&s->fstatebuf);
    s->fpublished = 0;
}

static PyObject *slot_publish_file(Slot *s, PyObject *args) {
    int fd, records_fd, valid;
    long long size, data_at, header, record_size, block, chunk;
    unsigned int magic;
    PyObject *state;
    if (!PyArg_ParseTuple(args, "iiLLOiLLILL", &fd, &records_fd, &size, &data_at, &state, &valid, &header,
                          &record_size, &magic, &block, &chunk))
        return NULL;
    if (block <= 0 || chunk % block != 0 || record_size != 4 + 4 * (chunk / block)) {
        PyErr_SetString(PyExc_ValueError, "a record is a magic number and one crc32 per block of a chunk");
        return NULL;
    }
    slot_release_file(s);
    if (PyObject_GetBuffer(state, &s->fstatebuf, PyBUF_SIMPLE) < 0)
        return NULL;
    s->fstate = (const uint8_t *)s->fstatebuf.buf;
    s->valid = (uint8_t)valid;
    s->fsize = size;
    s->records_fd = records_fd;
    s->data_at = data_at;
    s->header = header;
    s->record_size = record_size;
    s->magic = magic;
    s->block = block;
    s->fchunk = chunk;
    atomic_store(&s->no_o_direct, 0);
    s->fpublished = 1;
    atomic_store(&s->fd, fd);
    Py_RETURN_NONE;
}

static PyObject *slot_withdraw_file(Slot *s, PyObject *unused) {
    slot_release_file(s);
    Py_RETURN_NONE;
}

static PyObject *slot_get_direct(Slot *s, void *closure) { return PyBool_FromLong(atomic_load(&s->direct)); }

static int slot_set_direct(Slot *s, PyObject *value, void *closure) {
    int on = value ? PyObject_IsTrue(value) : 0;
    if (on < 0)
        return -1;
    atomic_store(&s->direct, on);
    return 0;
}

static PyObject *slot_disk_hits(Slot *s, void *closure) {
    return Py_BuildValue("KK", (unsigned long long)atomic_load(&s->disk_hits),
                         (unsigned long long)atomic_load(&s->disk_bytes));
}

static int slot_init(Slot *s, PyObject *args, PyObject *kwds) {
    atomic_store(&s->fd, -1);
    return 0;
}

static PyObject *slot_publish(Slot *s, PyObject *args) {
    PyObject *data, *state;
    Py_ssize_t size, chunk;
    if (!PyArg_ParseTuple(args, "OnOn", &data, &size, &state, &chunk))
        return NULL;
    slot_release(s);
    if (PyObject_GetBuffer(data, &s->databuf, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(state, &s->statebuf, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&s->databuf);
        return NULL;
    }
    if (size > s->databuf.len || chunk <= 0 || (size + chunk - 1) / chunk > s->statebuf.len) {
        PyBuffer_Release(&s->databuf);
        PyBuffer_Release(&s->statebuf);
        PyErr_SetString(PyExc_ValueError, "buffer smaller than the shard, or too few chunk states");
        return NULL;
    }
    s->size = size;
    s->chunk = chunk;
    s->nchunks = s->statebuf.len;
    s->state = (const uint8_t *)s->statebuf.buf;
    s->published = 1;
    atomic_store(&s->data, (const char *)s->databuf.buf);
    Py_RETURN_NONE;
}

static PyObject *slot_withdraw(Slot *s, PyObject *unused) {
    slot_release(s);
    Py_RETURN_NONE;
}

static PyObject *slot_last_used(Slot *s, void *closure) {
    return PyFloat_FromDouble(atomic_load(&s->used_ns) / 1e9);
}

static PyObject *slot_hits(Slot *s, void *closure) {
    return PyLong_FromUnsignedLongLong(atomic_load(&s->hits));
}

static void slot_dealloc(Slot *s) {
    slot_release(s);
    slot_release_file(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* Pinned bytes [off, off+len) of the shard if every chunk holding them is loaded, else NULL
 * (unpinned). The caller unpins after the reply. */
static const char *slot_pin(Slot *s, int64_t off, size_t len) {
    atomic_fetch_add(&s->pins, 1);
    const char *data = atomic_load(&s->data);
    if (data == NULL || off < 0 || off + (int64_t)len > s->size)
        goto miss;
    for (int64_t c = off / s->chunk, last = (off + (int64_t)len - 1) / s->chunk; c <= last; c++) {
        if (atomic_load_explicit((_Atomic uint8_t *)&s->state[c], memory_order_acquire) != CHUNK_LOADED)
            goto miss;
    }
    return data + off;
miss:
    atomic_fetch_sub(&s->pins, 1);
    return NULL;
}

/* Bytes [off, off+len) of the shard from its disk-tier file into out, every block they touch
 * checked against its chunk's record; 0 if a chunk is not there or anything fails (the caller
 * then asks Python, which logs it and reads from storage). */
/* Room for a disk-tier read, aligned for O_DIRECT: each worker keeps one small buffer (the
 * usual read, a member of a few blocks); larger reads get a mapping of their own, unmapped after
 * the reply, so no worker's heap keeps a megabyte it used once. */
#define KEPT_BUFFER (384 << 10)

static char *file_buffer(size_t need) {
    static __thread char *kept;
    if (need > KEPT_BUFFER) {
        void *p = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    if (kept == NULL && posix_memalign((void **)&kept, 4096, KEPT_BUFFER) != 0)
        kept = NULL;
    return kept;
}

static void file_buffer_done(char *p, size_t need) {
    if (p != NULL && need > KEPT_BUFFER)
        munmap(p, need);
}

static char *slot_read_file(Slot *s, int64_t off, size_t len, const char **out, size_t *room) {
    int ok = 0;
    atomic_fetch_add(&s->pins, 1);
    int fd = atomic_load(&s->fd);
    char *blocks = NULL;
    *room = 0;
    if (fd < 0 || off < 0 || len == 0 || off + (int64_t)len > s->fsize)
        goto done;
    int64_t end = off + (int64_t)len;
    int64_t first_chunk = off / s->fchunk, last_chunk = (end - 1) / s->fchunk;
    if (last_chunk >= s->fstatebuf.len)
        goto done;
    for (int64_t c = first_chunk; c <= last_chunk; c++)
        if (atomic_load_explicit((_Atomic uint8_t *)&s->fstate[c], memory_order_acquire) != s->valid)
            goto done;
    int64_t begin = off / s->block * s->block;
    int64_t stop = (end + s->block - 1) / s->block * s->block;
    if (stop > s->fsize)
        stop = s->fsize; /* the last block of a shard is checked over what it has */
    /* O_DIRECT wants whole pages: the shard's last block is read up to the page boundary */
    *room = (size_t)((stop - begin + 4095) / 4096 * 4096);
    blocks = file_buffer(*room);
    if (blocks == NULL)
        goto done;
    if (atomic_load(&s->no_o_direct))
        fd = s->records_fd;
    ssize_t got = pread(fd, blocks, *room, s->data_at + begin);
    if (got < 0 && errno == EINVAL && fd != s->records_fd) { /* as storage.local does: buffered then */
        atomic_store(&s->no_o_direct, 1);
        got = pread(s->records_fd, blocks, *room, s->data_at + begin);
    }
    if (got > stop - begin)
        got = stop - begin;
    if (got < end - begin)
        goto done; /* short: the shard ends inside the last block, or the file is damaged */
    int64_t have = begin + got;
    uint32_t record[1 + 256];
    int64_t per_chunk = s->fchunk / s->block;
    if (per_chunk > 256)
        goto done;
    for (int64_t c = first_chunk; c <= last_chunk; c++) {
        if (pread(s->records_fd, record, (size_t)s->record_size, s->header + c * s->record_size) != s->record_size ||
            record[0] != s->magic)
            goto done;
        int64_t lo = c * s->fchunk > begin ? c * s->fchunk : begin;
        int64_t hi = (c + 1) * s->fchunk < stop ? (c + 1) * s->fchunk : stop;
        for (int64_t b = lo; b < hi && b < have; b += s->block) {
            int64_t n = b + s->block <= have ? s->block : have - b;
            uLong crc = crc32(0L, (const Bytef *)blocks + (b - begin), (uInt)n);
            if ((uint32_t)crc != record[1 + (b - c * s->fchunk) / s->block])
                goto done;
        }
    }
    *out = blocks + (off - begin);
    ok = 1;
done:
    atomic_fetch_sub(&s->pins, 1);
    if (!ok) {
        file_buffer_done(blocks, *room);
        return NULL;
    }
    return blocks; /* the caller hands it to file_buffer_done after the reply */
}

static PyMethodDef slot_methods[] = {
    {"publish_file", (PyCFunction)slot_publish_file, METH_VARARGS,
     "publish_file(fd, records_fd, size, data_at, chunk_states, valid, header, record_size, magic, block, "
     "chunk): the shard's disk-tier file, read here while ``direct`` is set"},
    {"withdraw_file", (PyCFunction)slot_withdraw_file, METH_NOARGS,
     "stop reading the file; returns once no reader uses its descriptor"},
    {"publish", (PyCFunction)slot_publish, METH_VARARGS,
     "publish(buffer, size, chunk_states, chunk): serve loaded chunks of these bytes from C"},
    {"withdraw", (PyCFunction)slot_withdraw, METH_NOARGS,
     "stop serving the bytes; returns once no reader copies from them"},
    {NULL}};

static PyGetSetDef slot_getset[] = {
    {"last_used", (getter)slot_last_used, NULL, "CLOCK_MONOTONIC seconds of the last read served here", NULL},
    {"hits", (getter)slot_hits, NULL, "reads served here", NULL},
    {"direct", (getter)slot_get_direct, (setter)slot_set_direct,
     "the RAM cache refused the shard: serve its reads from the disk-tier file", NULL},
    {"disk_hits", (getter)slot_disk_hits, NULL, "(reads, bytes) served from the disk-tier file", NULL},
    {NULL}};

static PyTypeObject SlotType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shardfs.fuse._lowlevel.Slot",
    .tp_basicsize = sizeof(Slot),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One shard's bytes as the request loop reads them: its buffer in the RAM cache, its disk-tier file.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)slot_init,
    .tp_dealloc = (destructor)slot_dealloc,
    .tp_methods = slot_methods,
    .tp_getset = slot_getset,
};

/* ---- Table ------------------------------------------------------------------------------- */

/* Node n: a directory if n < ndirs, else member n - ndirs. */
typedef struct {
    PyObject_HEAD
    _Atomic int users;
    PyObject *view, *keep; /* keep: the arrays below live in these objects */
    uint32_t ndirs, nmembers, nshards, nsorted, symlink_kind;
    uint32_t uid, gid;
    uint64_t files, total_size;
    const uint64_t *ino;                  /* [ndirs + nmembers] */
    const uint64_t *by_ino;               /* [nsorted], ascending */
    const uint32_t *by_ino_node;          /* [nsorted] */
    const char *dir_names;                /* directory paths, concatenated */
    const int64_t *dir_name_end;          /* [ndirs] */
    const uint32_t *dir_mode, *dir_nlink; /* [ndirs] */
    const int64_t *dir_mtime_ns;          /* [ndirs] */
    const uint32_t *dir_parent;           /* [ndirs], node of the parent (the root's is 0) */
    const uint32_t *child_start;          /* [ndirs + 1] */
    uint32_t *children;                   /* sorted by name here */
    const char *names;                    /* member paths, concatenated */
    const int64_t *name_end;              /* [nmembers] */
    const int64_t *size, *offset;         /* [nmembers] */
    const uint32_t *shard;                /* [nmembers] */
    const uint16_t *mode;                 /* [nmembers] */
    const uint8_t *kind;                  /* [nmembers] */
    const double *mtime;                  /* [nmembers] */
    const uint8_t *shard_raw;             /* [nshards]: members are byte ranges of the shard */
    Slot **slots;                         /* [nshards], or NULL entries */
} Table;

static void node_path(const Table *t, uint32_t n, const char **p, size_t *len) {
    if (n < t->ndirs) {
        int64_t start = n ? t->dir_name_end[n - 1] : 0;
        *p = t->dir_names + start;
        *len = (size_t)(t->dir_name_end[n] - start);
    } else {
        uint32_t m = n - t->ndirs;
        int64_t start = m ? t->name_end[m - 1] : 0;
        *p = t->names + start;
        *len = (size_t)(t->name_end[m] - start);
    }
}

static void base_name(const Table *t, uint32_t n, const char **p, size_t *len) {
    const char *path;
    size_t plen;
    node_path(t, n, &path, &plen);
    const char *slash = plen ? memrchr(path, '/', plen) : NULL;
    *p = slash ? slash + 1 : path;
    *len = plen - (size_t)(*p - path);
}

static int compare_names(const char *a, size_t alen, const char *b, size_t blen) {
    int c = memcmp(a, b, alen < blen ? alen : blen);
    return c ? c : (alen > blen) - (alen < blen);
}

static int compare_children(const void *x, const void *y, void *table) {
    const char *a, *b;
    size_t alen, blen;
    base_name(table, *(const uint32_t *)x, &a, &alen);
    base_name(table, *(const uint32_t *)y, &b, &blen);
    return compare_names(a, alen, b, blen);
}

/* The node of an inode number, or -1. */
static int64_t resolve(const Table *t, fuse_ino_t ino) {
    if (ino == FUSE_ROOT_ID)
        return 0;
    uint32_t lo = 0, hi = t->nsorted;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (t->by_ino[mid] < ino)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < t->nsorted && t->by_ino[lo] == ino ? (int64_t)t->by_ino_node[lo] : -1;
}

/* The child of directory d called name, or -1. */
static int64_t find_child(const Table *t, uint32_t d, const char *name) {
    size_t len = strlen(name);
    uint32_t lo = t->child_start[d], hi = t->child_start[d + 1];
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        const char *b;
        size_t blen;
        base_name(t, t->children[mid], &b, &blen);
        int c = compare_names(b, blen, name, len);
        if (c == 0)
            return t->children[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

static void fill_stat(const Table *t, uint32_t n, struct stat *st) {
    memset(st, 0, sizeof *st);
    st->st_ino = t->ino[n];
    st->st_uid = t->uid;
    st->st_gid = t->gid;
    int64_t mtime_ns;
    if (n < t->ndirs) {
        st->st_mode = S_IFDIR | t->dir_mode[n];
        st->st_nlink = t->dir_nlink[n];
        st->st_size = 4096;
        st->st_blocks = 8;
        mtime_ns = t->dir_mtime_ns[n];
    } else {
        uint32_t m = n - t->ndirs;
        st->st_mode = (t->kind[m] == t->symlink_kind ? S_IFLNK : S_IFREG) | t->mode[m];
        st->st_nlink = 1;
        st->st_size = t->size[m];
        st->st_blocks = (t->size[m] + 511) / 512;
        mtime_ns = (int64_t)(t->mtime[m] * 1e9);
    }
    st->st_mtim.tv_sec = mtime_ns / 1000000000;
    st->st_mtim.tv_nsec = mtime_ns % 1000000000;
    if (st->st_mtim.tv_nsec < 0) {
        st->st_mtim.tv_sec -= 1;
        st->st_mtim.tv_nsec += 1000000000;
    }
    st->st_atim = st->st_ctim = st->st_mtim;
}

/* Fields: (name, address of the pointer, element size). Each array must hold count elements. */
static int take_array(PyObject *arrays, const char *name, const void **out, Py_ssize_t itemsize,
                      Py_ssize_t count, PyObject *keep) {
    PyObject *obj = PyDict_GetItemString(arrays, name);
    if (obj == NULL) {
        PyErr_Format(PyExc_KeyError, "table array %s missing", name);
        return -1;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view.len != count * itemsize) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "table array %s: %zd bytes, expected %zd", name, view.len, count * itemsize);
        return -1;
    }
    *out = view.buf;
    /* The object stays referenced in keep (a list) for the table's life: its memory stays put.
     * Without keep, *out is good until the caller returns (it copies the array). */
    int rc = keep ? PyList_Append(keep, obj) : 0;
    PyBuffer_Release(&view);
    return rc;
}

static int table_init(Table *t, PyObject *args, PyObject *kwds) {
    PyObject *arrays, *view, *slots;
    unsigned int ndirs, nmembers, nshards, nsorted, symlink_kind, uid, gid;
    unsigned long long files, total;
    static char *kwlist[] = {"arrays", "view", "slots", "ndirs", "nmembers", "nsorted", "symlink_kind",
                             "uid", "gid", "files", "total_size", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO!IIIIIIKK", kwlist, &PyDict_Type, &arrays, &view,
                                     &PyTuple_Type, &slots, &ndirs, &nmembers, &nsorted, &symlink_kind, &uid,
                                     &gid, &files, &total))
        return -1;
    if (ndirs == 0) {
        PyErr_SetString(PyExc_ValueError, "a table has at least the root directory");
        return -1;
    }
    nshards = (unsigned int)PyTuple_GET_SIZE(slots);
    t->keep = PyList_New(0);
    if (t->keep == NULL)
        return -1;
    PyObject *dir_names = PyDict_GetItemString(arrays, "dir_names");
    PyObject *names = PyDict_GetItemString(arrays, "names");
    if (dir_names == NULL || names == NULL || !PyBytes_Check(dir_names) || !PyBytes_Check(names)) {
        PyErr_SetString(PyExc_TypeError, "dir_names and names must be bytes");
        return -1;
    }
    if (PyList_Append(t->keep, dir_names) < 0 || PyList_Append(t->keep, names) < 0)
        return -1;
    t->dir_names = PyBytes_AS_STRING(dir_names);
    t->names = PyBytes_AS_STRING(names);
    Py_ssize_t nn = (Py_ssize_t)ndirs + nmembers;
    const void *children;
    if (take_array(arrays, "ino", (const void **)&t->ino, 8, nn, t->keep) < 0 ||
        take_array(arrays, "by_ino", (const void **)&t->by_ino, 8, nsorted, t->keep) < 0 ||
        take_array(arrays, "by_ino_node", (const void **)&t->by_ino_node, 4, nsorted, t->keep) < 0 ||
        take_array(arrays, "dir_name_end", (const void **)&t->dir_name_end, 8, ndirs, t->keep) < 0 ||
        take_array(arrays, "dir_mode", (const void **)&t->dir_mode, 4, ndirs, t->keep) < 0 ||
        take_array(arrays, "dir_nlink", (const void **)&t->dir_nlink, 4, ndirs, t->keep) < 0 ||
        take_array(arrays, "dir_mtime_ns", (const void **)&t->dir_mtime_ns, 8, ndirs, t->keep) < 0 ||
        take_array(arrays, "dir_parent", (const void **)&t->dir_parent, 4, ndirs, t->keep) < 0 ||
        take_array(arrays, "child_start", (const void **)&t->child_start, 4, ndirs + 1, t->keep) < 0 ||
        take_array(arrays, "name_end", (const void **)&t->name_end, 8, nmembers, t->keep) < 0 ||
        take_array(arrays, "size", (const void **)&t->size, 8, nmembers, t->keep) < 0 ||
        take_array(arrays, "offset", (const void **)&t->offset, 8, nmembers, t->keep) < 0 ||
        take_array(arrays, "shard", (const void **)&t->shard, 4, nmembers, t->keep) < 0 ||
        take_array(arrays, "mode", (const void **)&t->mode, 2, nmembers, t->keep) < 0 ||
        take_array(arrays, "kind", (const void **)&t->kind, 1, nmembers, t->keep) < 0 ||
        take_array(arrays, "mtime", (const void **)&t->mtime, 8, nmembers, t->keep) < 0 ||
        take_array(arrays, "shard_raw", (const void **)&t->shard_raw, 1, nshards, t->keep) < 0)
        return -1;
    uint32_t nchildren = t->child_start[ndirs];
    if (take_array(arrays, "children", &children, 4, nchildren, NULL) < 0)
        return -1;
    if (t->dir_name_end[ndirs - 1] > PyBytes_GET_SIZE(dir_names) ||
        (nmembers && t->name_end[nmembers - 1] > PyBytes_GET_SIZE(names))) {
        PyErr_SetString(PyExc_ValueError, "name ends past the names");
        return -1;
    }
    for (uint32_t i = 0; i < nchildren; i++) {
        if (((const uint32_t *)children)[i] >= nn) {
            PyErr_SetString(PyExc_ValueError, "a child is not a node");
            return -1;
        }
    }
    for (uint32_t i = 0; i < nsorted; i++) {
        if (t->by_ino_node[i] >= nn || (i && t->by_ino[i - 1] >= t->by_ino[i])) {
            PyErr_SetString(PyExc_ValueError, "by_ino must be strictly ascending and name nodes");
            return -1;
        }
    }
    for (uint32_t i = 0; i < nmembers; i++) {
        if (t->shard[i] >= nshards) {
            PyErr_SetString(PyExc_ValueError, "a member's shard is out of range");
            return -1;
        }
    }
    /* Our own sorted copy: lookups are a binary search by name within the directory. */
    t->children = PyMem_Malloc((nchildren ? nchildren : 1) * sizeof(uint32_t));
    t->slots = PyMem_Calloc(nshards ? nshards : 1, sizeof(Slot *));
    if (t->children == NULL || t->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(t->children, children, nchildren * sizeof(uint32_t));
    t->ndirs = ndirs;
    t->nmembers = nmembers;
    t->nshards = nshards;
    t->nsorted = nsorted;
    t->symlink_kind = symlink_kind;
    t->uid = uid;
    t->gid = gid;
    t->files = files;
    t->total_size = total;
    Py_BEGIN_ALLOW_THREADS
    for (uint32_t d = 0; d < ndirs; d++) {
        uint32_t lo = t->child_start[d], hi = t->child_start[d + 1];
        if (hi > lo + 1)
            qsort_r(t->children + lo, hi - lo, sizeof(uint32_t), compare_children, t);
    }
    Py_END_ALLOW_THREADS
    for (uint32_t s = 0; s < nshards; s++) {
        PyObject *slot = PyTuple_GET_ITEM(slots, s);
        if (slot == Py_None)
            continue;
        if (!PyObject_TypeCheck(slot, &SlotType)) {
            PyErr_SetString(PyExc_TypeError, "slots holds Slot objects or None");
            return -1;
        }
        Py_INCREF(slot);
        t->slots[s] = (Slot *)slot;
    }
    Py_INCREF(view);
    t->view = view;
    return 0;
}

static PyObject *table_lookup(Table *t, PyObject *args) {
    unsigned long long parent;
    const char *name;
    if (!PyArg_ParseTuple(args, "Ky", &parent, &name))
        return NULL;
    int64_t d = resolve(t, parent);
    if (d < 0 || d >= t->ndirs)
        Py_RETURN_NONE;
    int64_t n = find_child(t, (uint32_t)d, name);
    if (n < 0)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(t->ino[n]);
}

static void table_dealloc(Table *t) {
    if (t->slots) {
        for (uint32_t s = 0; s < t->nshards; s++)
            Py_XDECREF(t->slots[s]);
        PyMem_Free(t->slots);
    }
    PyMem_Free(t->children);
    Py_XDECREF(t->view);
    Py_XDECREF(t->keep);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyMethodDef table_methods[] = {
    {"lookup", (PyCFunction)table_lookup, METH_VARARGS,
     "lookup(parent_ino, name) -> ino or None: the request loop's lookup, for tests"},
    {NULL}};

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shardfs.fuse._lowlevel.Table",
    .tp_basicsize = sizeof(Table),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One view of the dataset as the request loop answers from it.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)table_init,
    .tp_dealloc = (destructor)table_dealloc,
    .tp_methods = table_methods,
};

/* ---- Session ----------------------------------------------------------------------------- */

enum {
    OP_LOOKUP, OP_GETATTR, OP_OPENDIR, OP_READDIR, OP_READ, OP_IOCTL, OP_STATFS, OP_GETXATTR,
    OP_LISTXATTR, OP_READLINK, OP_FORGET, OP_WRITE_REFUSED, OP_COUNT
};
static const char *OP_NAMES[OP_COUNT] = {"lookup", "getattr", "opendir", "readdir", "read", "ioctl",
                                         "statfs", "getxattr", "listxattr", "readlink", "forget", "erofs"};

/* Pushing a member's bytes (push_member): at most this many, and remembered for this many
 * lookups in flight; a lookup forgotten here only means a READ request later. */
#define PUSH_MAX (256 << 10)
#define FRESH_SLOTS 4096

typedef struct {
    _Atomic uint64_t n;
    char pad[56]; /* one cache line each: the two cores do not fight over one line */
} Counter;

typedef struct {
    PyObject_HEAD
    struct fuse_session *se;
    _Atomic(Table *) table;
    PyObject *ops; /* shardfs.fuse.ops.ShardFS: misses and control */
    double entry_timeout, negative_timeout;
    int mounted;
    Counter counts[OP_COUNT];
    Counter fast_bytes; /* bytes of reads answered here (Python counts the others) */
    Counter ram_reads, disk_reads; /* reads answered here from the RAM cache, from the disk tier */
    Counter pushes, push_failures; /* members put in the page cache with an ioctl's answer */
    int push;
    _Atomic uint64_t fresh[FRESH_SLOTS]; /* inodes of members looked up since (direct-mapped) */
} Session;

#define COUNT(s, op) atomic_fetch_add_explicit(&(s)->counts[op].n, 1, memory_order_relaxed)

static Table *table_enter(Session *s) {
    for (;;) {
        Table *t = atomic_load(&s->table);
        atomic_fetch_add(&t->users, 1);
        if (atomic_load(&s->table) == t)
            return t;
        atomic_fetch_sub(&t->users, 1);
    }
}

static void table_leave(Table *t) { atomic_fetch_sub(&t->users, 1); }

/* A libfuse worker's Python thread state lives as long as the thread (one extra Ensure, never
 * released): creating one per request costs an mmap and munmap each time. */
static PyGILState_STATE python_enter(void) {
    static __thread int kept;
    if (!kept) {
        PyGILState_Ensure();
        PyEval_SaveThread(); /* keep the thread state, not the GIL */
        kept = 1;
    }
    return PyGILState_Ensure();
}

/* The errno of the Python exception set (FuseOSError or any OSError), else EIO with the
 * traceback on stderr (the daemon's log). Clears it. */
static int python_errno(void) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    int err = EIO;
    if (value && PyErr_GivenExceptionMatches(value, PyExc_OSError)) {
        PyObject *e = PyObject_GetAttrString(value, "errno");
        if (e && PyLong_Check(e)) {
            long v = PyLong_AsLong(e);
            if (v > 0 && v < 4096)
                err = (int)v;
        }
        Py_XDECREF(e);
        PyErr_Clear();
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
    } else {
        PyErr_Restore(type, value, tb);
        PyErr_Print();
    }
    return err;
}

/* ops.<method>(b"/path", *extra) with the GIL; NULL with *err set on failure. */
static PyObject *call_ops(Session *s, Table *t, uint32_t node, const char *method, const char *fmt, ...) {
    const char *path;
    size_t len;
    node_path(t, node, &path, &len);
    PyObject *p = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len + 1);
    if (p == NULL)
        return NULL;
    char *buf = PyBytes_AS_STRING(p);
    buf[0] = '/';
    memcpy(buf + 1, path, len);
    PyObject *result;
    if (fmt && *fmt) {
        va_list va;
        va_start(va, fmt);
        PyObject *extra = Py_VaBuildValue(fmt, va);
        va_end(va);
        if (extra == NULL) {
            Py_DECREF(p);
            return NULL;
        }
        PyObject *argv = PyTuple_New(1 + PyTuple_GET_SIZE(extra));
        if (argv == NULL) {
            Py_DECREF(p);
            Py_DECREF(extra);
            return NULL;
        }
        PyTuple_SET_ITEM(argv, 0, p);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(extra); i++) {
            PyObject *item = PyTuple_GET_ITEM(extra, i);
            Py_INCREF(item);
            PyTuple_SET_ITEM(argv, i + 1, item);
        }
        Py_DECREF(extra);
        PyObject *fn = PyObject_GetAttrString(s->ops, method);
        result = fn ? PyObject_Call(fn, argv, NULL) : NULL;
        Py_XDECREF(fn);
        Py_DECREF(argv);
    } else {
        result = PyObject_CallMethod(s->ops, method, "N", p);
    }
    return result;
}

static Session *session_of(fuse_req_t req) { return (Session *)fuse_req_userdata(req); }

/* The table and node of ino for a request; on ENOENT replies and returns -1 (table left). */
static int64_t enter_node(fuse_req_t req, fuse_ino_t ino, Table **table) {
    Table *t = *table = table_enter(session_of(req));
    int64_t n = resolve(t, ino);
    if (n < 0) {
        table_leave(t);
        fuse_reply_err(req, ENOENT);
    }
    return n;
}

/* An xattr value, or its size when asked for 0 bytes. */
static void reply_xattr(fuse_req_t req, size_t size, const char *value, size_t len) {
    if (size == 0)
        fuse_reply_xattr(req, len);
    else if (size < len)
        fuse_reply_err(req, ERANGE);
    else
        fuse_reply_buf(req, value, len);
}

static void ll_init(void *userdata, struct fuse_conn_info *conn) {
    Session *s = userdata;
    /* Always readdirplus: with "auto" the kernel asks for attributes only in the first batch of
     * a large directory, and each file listed after it costs a LOOKUP when opened. */
    if (conn->capable & FUSE_CAP_READDIRPLUS)
        conn->want = (conn->want | FUSE_CAP_READDIRPLUS) & ~FUSE_CAP_READDIRPLUS_AUTO;
    if (conn->capable & FUSE_CAP_CACHE_SYMLINKS)
        conn->want |= FUSE_CAP_CACHE_SYMLINKS;
    PyGILState_STATE g = python_enter();
    PyObject *r = PyObject_CallMethod(s->ops, "init", "s", "/");
    if (r == NULL)
        PyErr_Print();
    Py_XDECREF(r);
    PyGILState_Release(g);
}

/* A regular file small enough to push (push_member). */
static int pushable(const Table *t, uint32_t n) {
    if (n < t->ndirs)
        return 0;
    uint32_t m = n - t->ndirs;
    return t->kind[m] != t->symlink_kind && t->size[m] > 0 && t->size[m] <= PUSH_MAX;
}

static void entry_of(Session *s, Table *t, uint32_t n, struct fuse_entry_param *e) {
    memset(e, 0, sizeof *e);
    e->ino = t->ino[n];
    e->generation = 1;
    fill_stat(t, n, &e->attr);
    e->attr_timeout = e->entry_timeout = s->entry_timeout;
}

static void ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    Session *s = session_of(req);
    COUNT(s, OP_LOOKUP);
    Table *t;
    int64_t d = enter_node(req, parent, &t);
    if (d < 0)
        return;
    if (d >= t->ndirs) {
        table_leave(t);
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    struct fuse_entry_param e;
    int64_t n = find_child(t, (uint32_t)d, name);
    if (n >= 0) {
        entry_of(s, t, (uint32_t)n, &e);
        if (s->push && pushable(t, (uint32_t)n))
            atomic_store_explicit(&s->fresh[e.ino % FRESH_SLOTS], e.ino, memory_order_relaxed);
    } else { /* a negative entry, cached for a while: names tried in vain cost nothing */
        memset(&e, 0, sizeof e);
        e.entry_timeout = s->negative_timeout;
    }
    table_leave(t);
    fuse_reply_entry(req, &e);
}

static void ll_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
    COUNT(session_of(req), OP_FORGET); /* the arrays outlive every node: nothing to free */
    fuse_reply_none(req);
}

static void ll_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets) {
    COUNT(session_of(req), OP_FORGET);
    fuse_reply_none(req);
}

static void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    Session *s = session_of(req);
    COUNT(s, OP_GETATTR);
    Table *t;
    int64_t n = enter_node(req, ino, &t);
    if (n < 0)
        return;
    struct stat st;
    fill_stat(t, (uint32_t)n, &st);
    table_leave(t);
    fuse_reply_attr(req, &st, s->entry_timeout);
}

static void ll_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    /* ENOSYS: the kernel stops sending OPENDIR/RELEASEDIR for this mount, and opens every
     * directory with FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR (fs/fuse/file.c, "default for no-open"):
     * it keeps each listing in the directory's page cache, so the next listing never reaches us.
     * A rescan invalidates them (Session.invalidate). */
    COUNT(session_of(req), OP_OPENDIR);
    fuse_reply_err(req, ENOSYS);
}

static void readdir_common(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, int plus) {
    Session *s = session_of(req);
    COUNT(s, OP_READDIR);
    Table *t;
    int64_t d = enter_node(req, ino, &t);
    if (d < 0)
        return;
    if (d >= t->ndirs) {
        table_leave(t);
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    char *buf = malloc(size);
    if (buf == NULL) {
        table_leave(t);
        fuse_reply_err(req, ENOMEM);
        return;
    }
    uint32_t first = t->child_start[d], count = t->child_start[d + 1] - first;
    size_t used = 0;
    for (off_t i = off; i < (off_t)count + 2; i++) {
        const char *name;
        size_t len;
        uint32_t n;
        char namebuf[4096];
        if (i < 2) {
            n = i == 0 ? (uint32_t)d : t->dir_parent[d];
            name = i == 0 ? "." : "..";
            len = strlen(name);
        } else {
            n = t->children[first + (uint32_t)(i - 2)];
            base_name(t, n, &name, &len);
        }
        if (len >= sizeof namebuf)
            continue; /* no name this long can be listed; the index refuses them anyway */
        memcpy(namebuf, name, len);
        namebuf[len] = 0;
        size_t room = size - used, need;
        if (plus) {
            struct fuse_entry_param e;
            entry_of(s, t, n, &e);
            if (i < 2)
                e.ino = 0; /* the kernel takes no reference for . and .. */
            need = fuse_add_direntry_plus(req, buf + used, room, namebuf, &e, i + 1);
        } else {
            struct stat st;
            fill_stat(t, n, &st);
            need = fuse_add_direntry(req, buf + used, room, namebuf, &st, i + 1);
        }
        if (need > room)
            break; /* the kernel's buffer is full: it asks again from this offset */
        used += need;
    }
    table_leave(t);
    fuse_reply_buf(req, buf, used);
    free(buf);
}

static void ll_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
    readdir_common(req, ino, size, off, 0);
}

static void ll_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
    readdir_common(req, ino, size, off, 1);
}

static void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    /* ENOSYS: the kernel stops sending OPEN/RELEASE for every file of this mount (zero-message
     * opens) and keeps their page cache across opens. */
    fuse_reply_err(req, ENOSYS);
}

static void ll_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    fuse_reply_err(req, ENOSYS);
}

static void read_in_python(Session *s, fuse_req_t req, Table *t, uint32_t n, size_t size, off_t off) {
    PyGILState_STATE g = python_enter();
    PyObject *data = call_ops(s, t, n, "read", "(nLO)", (Py_ssize_t)size, (long long)off, Py_None);
    if (data == NULL) {
        int err = python_errno();
        PyGILState_Release(g);
        fuse_reply_err(req, err);
        return;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        int err = python_errno();
        Py_DECREF(data);
        PyGILState_Release(g);
        fuse_reply_err(req, err);
        return;
    }
    if ((size_t)view.len > size) {
        PyBuffer_Release(&view);
        Py_DECREF(data);
        PyErr_Format(PyExc_RuntimeError, "read returned %zd bytes, more than the %zu asked for", view.len, size);
        PyErr_Print();
        PyGILState_Release(g);
        fuse_reply_err(req, EIO);
        return;
    }
    /* The buffer (a view of the RAM cache, or bytes) stays alive until the reply is written. */
    Py_BEGIN_ALLOW_THREADS
    fuse_reply_buf(req, view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    Py_DECREF(data);
    PyGILState_Release(g);
}

/* Whether ino was looked up since its last read or push; it is not any more. */
static int forget_fresh(Session *s, fuse_ino_t ino) {
    _Atomic uint64_t *fresh = &s->fresh[ino % FRESH_SLOTS];
    uint64_t expected = ino;
    return atomic_load_explicit(fresh, memory_order_relaxed) == ino && atomic_compare_exchange_strong(fresh, &expected, 0);
}

/* Bytes of a member answered without Python: pinned in the RAM cache, or read from the disk
 * tier into a buffer. fast_bytes fills one of these; fast_done releases it and counts it. */
typedef struct {
    Slot *slot;
    char *blocks; /* the disk tier's buffer, NULL for RAM */
    size_t room;
} Fast;

static const char *fast_bytes(const Table *t, uint32_t m, int64_t off, size_t len, Fast *f) {
    uint32_t shard = t->shard[m];
    Slot *slot = f->slot = t->slots[shard];
    f->blocks = NULL;
    f->room = 0;
    if (!len || !t->shard_raw[shard] || !slot)
        return NULL;
    const char *bytes = slot_pin(slot, t->offset[m] + off, len);
    if (bytes || !atomic_load(&slot->direct))
        return bytes;
    f->blocks = slot_read_file(slot, t->offset[m] + off, len, &bytes, &f->room);
    return f->blocks ? bytes : NULL;
}

/* served: the bytes went out as the answer to this READ (ram/disk reads), or else by a push */
static void fast_done(Session *s, Fast *f, size_t len, Counter *served) {
    Slot *slot = f->slot;
    if (f->blocks) {
        file_buffer_done(f->blocks, f->room);
        atomic_fetch_add_explicit(&slot->disk_hits, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&slot->disk_bytes, len, memory_order_relaxed);
    } else {
        atomic_fetch_sub(&slot->pins, 1);
        atomic_fetch_add_explicit(&slot->hits, 1, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(served ? &served->n : f->blocks ? &s->disk_reads.n : &s->ram_reads.n, 1,
                              memory_order_relaxed);
    atomic_store_explicit(&slot->used_ns, now_ns(), memory_order_relaxed);
    atomic_fetch_add_explicit(&s->fast_bytes.n, len, memory_order_relaxed);
}

static void ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
    Session *s = session_of(req);
    Table *t;
    int64_t n = enter_node(req, ino, &t);
    if (n < 0)
        return;
    if (n < t->ndirs) {
        table_leave(t);
        fuse_reply_err(req, EISDIR);
        return;
    }
    uint32_t m = (uint32_t)n - t->ndirs;
    int64_t left = t->size[m] - off;
    size_t len = left <= 0 ? 0 : (size_t)left < size ? (size_t)left : size;
    forget_fresh(s, ino); /* read without an open(): its pages are filling, no push later */
    Fast f;
    const char *bytes = fast_bytes(t, m, off, len, &f);
    if (bytes) {
        fuse_reply_buf(req, bytes, len);
        fast_done(s, &f, len, NULL);
        COUNT(s, OP_READ);
        table_leave(t);
        return;
    }
    /* Python counts the reads it serves (and their errors) itself. */
    read_in_python(s, req, t, (uint32_t)n, size, off);
    table_leave(t);
}

/* A member looked up just now has a new inode in the kernel, so no cached pages: the first
 * thing Python's open() does with it is the isatty ioctl, and the read comes right after. If
 * its bytes are at hand, they go into the kernel's page cache with that ioctl's answer
 * (FUSE_NOTIFY_STORE), and the read is answered by the kernel without a READ request.
 * The lookup cannot carry them itself: the inode exists only once the reply is processed. */
static void push_member(Session *s, fuse_ino_t ino) {
    Table *t = table_enter(s);
    int64_t n = resolve(t, ino);
    if (n >= 0 && pushable(t, (uint32_t)n)) {
        uint32_t m = (uint32_t)n - t->ndirs;
        size_t len = (size_t)t->size[m];
        Fast f;
        const char *bytes = fast_bytes(t, m, 0, len, &f);
        if (bytes) {
            struct fuse_bufvec bv = FUSE_BUFVEC_INIT(len);
            bv.buf[0].mem = (void *)bytes;
            int rc = fuse_lowlevel_notify_store(s->se, ino, 0, &bv, 0);
            fast_done(s, &f, rc == 0 ? len : 0, rc == 0 ? &s->pushes : &s->push_failures);
        }
    }
    table_leave(t);
}

static void ll_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void *arg, struct fuse_file_info *fi,
                     unsigned flags, const void *in_buf, size_t in_bufsz, size_t out_bufsz) {
    /* Every Python open() asks isatty() (TCGETS): "not a terminal", without leaving C. */
    Session *s = session_of(req);
    COUNT(s, OP_IOCTL);
    if (forget_fresh(s, ino))
        push_member(s, ino);
    fuse_reply_err(req, ENOTTY);
}

static void ll_statfs(fuse_req_t req, fuse_ino_t ino) {
    Session *s = session_of(req);
    COUNT(s, OP_STATFS);
    Table *t = table_enter(s);
    struct statvfs st;
    memset(&st, 0, sizeof st);
    st.f_bsize = st.f_frsize = 4096;
    st.f_blocks = (t->total_size + 4095) / 4096;
    st.f_files = t->ndirs + t->files;
    st.f_namemax = 255;
    table_leave(t);
    fuse_reply_statfs(req, &st);
}

static void ll_readlink(fuse_req_t req, fuse_ino_t ino) {
    Session *s = session_of(req);
    COUNT(s, OP_READLINK);
    Table *t;
    int64_t n = enter_node(req, ino, &t);
    if (n < 0)
        return;
    PyGILState_STATE g = python_enter();
    PyObject *r = call_ops(s, t, (uint32_t)n, "readlink", NULL);
    table_leave(t);
    if (r == NULL) {
        int err = python_errno();
        PyGILState_Release(g);
        fuse_reply_err(req, err);
        return;
    }
    PyObject *target = PyUnicode_Check(r) ? PyUnicode_EncodeFSDefault(r) : (Py_INCREF(r), r);
    Py_DECREF(r);
    if (target == NULL || !PyBytes_Check(target)) {
        Py_XDECREF(target);
        PyErr_Clear();
        PyGILState_Release(g);
        fuse_reply_err(req, EIO);
        return;
    }
    fuse_reply_readlink(req, PyBytes_AS_STRING(target));
    Py_DECREF(target);
    PyGILState_Release(g);
}

static void ll_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size) {
    Session *s = session_of(req);
    COUNT(s, OP_GETXATTR);
    Table *t;
    int64_t n = enter_node(req, ino, &t);
    if (n < 0)
        return;
    if (strncmp(name, "user.shardfs.", 13) != 0) { /* ls -l asks every file for ACLs and labels */
        table_leave(t);
        fuse_reply_err(req, ENODATA);
        return;
    }
    PyGILState_STATE g = python_enter();
    PyObject *r = call_ops(s, t, (uint32_t)n, "getxattr", "(s)", name);
    table_leave(t);
    if (r == NULL || !PyBytes_Check(r)) {
        int err = r == NULL ? python_errno() : EIO;
        Py_XDECREF(r);
        PyGILState_Release(g);
        fuse_reply_err(req, err);
        return;
    }
    reply_xattr(req, size, PyBytes_AS_STRING(r), (size_t)PyBytes_GET_SIZE(r));
    Py_DECREF(r);
    PyGILState_Release(g);
}

static void ll_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
    Session *s = session_of(req);
    COUNT(s, OP_LISTXATTR);
    Table *t;
    int64_t n = enter_node(req, ino, &t);
    if (n < 0)
        return;
    PyGILState_STATE g = python_enter();
    PyObject *r = call_ops(s, t, (uint32_t)n, "listxattr", NULL);
    table_leave(t);
    PyObject *joined = NULL;
    if (r != NULL) { /* "a\0b\0" from ["a", "b"] */
        PyObject *sep = PyUnicode_FromStringAndSize("\0", 1);
        PyObject *body = sep ? PyUnicode_Join(sep, r) : NULL;
        if (body != NULL) {
            joined = PyUnicode_GET_LENGTH(body) ? PyUnicode_FromFormat("%U%c", body, 0) : (Py_INCREF(body), body);
            Py_DECREF(body);
        }
        Py_XDECREF(sep);
        Py_DECREF(r);
    }
    PyObject *bytes = joined ? PyUnicode_EncodeFSDefault(joined) : NULL;
    Py_XDECREF(joined);
    if (bytes == NULL) {
        int err = python_errno();
        PyGILState_Release(g);
        fuse_reply_err(req, err);
        return;
    }
    reply_xattr(req, size, PyBytes_AS_STRING(bytes), (size_t)PyBytes_GET_SIZE(bytes));
    Py_DECREF(bytes);
    PyGILState_Release(g);
}

/* Read-only means read-only: every write answers EROFS (the mount is "ro" as well). */
#define REFUSE(req)                                   \
    do {                                              \
        COUNT(session_of(req), OP_WRITE_REFUSED);     \
        fuse_reply_err(req, EROFS);                   \
    } while (0)

static void ll_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set, struct fuse_file_info *fi) {
    REFUSE(req);
}
static void ll_mknod(fuse_req_t req, fuse_ino_t p, const char *name, mode_t mode, dev_t rdev) { REFUSE(req); }
static void ll_mkdir(fuse_req_t req, fuse_ino_t p, const char *name, mode_t mode) { REFUSE(req); }
static void ll_unlink(fuse_req_t req, fuse_ino_t p, const char *name) { REFUSE(req); }
static void ll_rmdir(fuse_req_t req, fuse_ino_t p, const char *name) { REFUSE(req); }
static void ll_symlink(fuse_req_t req, const char *link, fuse_ino_t p, const char *name) { REFUSE(req); }
static void ll_rename(fuse_req_t req, fuse_ino_t p, const char *name, fuse_ino_t np, const char *nn,
                      unsigned int flags) {
    REFUSE(req);
}
static void ll_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t np, const char *nn) { REFUSE(req); }
static void ll_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                     struct fuse_file_info *fi) {
    REFUSE(req);
}
static void ll_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size,
                        int flags) {
    REFUSE(req);
}
static void ll_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name) { REFUSE(req); }
static void ll_create(fuse_req_t req, fuse_ino_t p, const char *name, mode_t mode, struct fuse_file_info *fi) {
    REFUSE(req);
}
static void ll_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
                         struct fuse_file_info *fi) {
    REFUSE(req);
}
static void ll_copy_file_range(fuse_req_t req, fuse_ino_t ino_in, off_t off_in, struct fuse_file_info *fi_in,
                               fuse_ino_t ino_out, off_t off_out, struct fuse_file_info *fi_out, size_t len,
                               int flags) {
    REFUSE(req);
}

static const struct fuse_lowlevel_ops LL_OPS = {
    .init = ll_init,
    .lookup = ll_lookup,
    .forget = ll_forget,
    .forget_multi = ll_forget_multi,
    .getattr = ll_getattr,
    .opendir = ll_opendir,
    .readdir = ll_readdir,
    .readdirplus = ll_readdirplus,
    .open = ll_open,
    .flush = ll_flush,
    .read = ll_read,
    .ioctl = ll_ioctl,
    .statfs = ll_statfs,
    .readlink = ll_readlink,
    .getxattr = ll_getxattr,
    .listxattr = ll_listxattr,
    .setattr = ll_setattr,
    .mknod = ll_mknod,
    .mkdir = ll_mkdir,
    .unlink = ll_unlink,
    .rmdir = ll_rmdir,
    .symlink = ll_symlink,
    .rename = ll_rename,
    .link = ll_link,
    .write = ll_write,
    .setxattr = ll_setxattr,
    .removexattr = ll_removexattr,
    .create = ll_create,
    .fallocate = ll_fallocate,
    .copy_file_range = ll_copy_file_range,
};

static int session_init(Session *s, PyObject *args, PyObject *kwds) {
    PyObject *ops;
    Table *table;
    const char *mountpoint, *options;
    double entry_timeout, negative_timeout;
    int push = 1;
    static char *kwlist[] = {"ops", "table", "mountpoint", "options", "entry_timeout", "negative_timeout", "push",
                             NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!ssdd|p", kwlist, &ops, &TableType, &table, &mountpoint,
                                     &options, &entry_timeout, &negative_timeout, &push))
        return -1;
    if (s->se != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Session is set up once");
        return -1;
    }
    Py_INCREF(ops);
    s->ops = ops;
    Py_INCREF(table);
    atomic_store(&s->table, table);
    s->entry_timeout = entry_timeout;
    s->negative_timeout = negative_timeout;
    s->push = push;
    char *argv[] = {"shardfs", "-o", (char *)options, NULL};
    struct fuse_args fargs = FUSE_ARGS_INIT(3, argv);
    s->se = fuse_session_new(&fargs, &LL_OPS, sizeof LL_OPS, s);
    if (s->se == NULL) {
        PyErr_Format(PyExc_OSError, "libfuse refused the options %s (see the lines above)", options);
        return -1;
    }
    if (fuse_session_mount(s->se, mountpoint) != 0) {
        PyErr_Format(PyExc_OSError, "cannot mount at %s (see the lines above)", mountpoint);
        return -1;
    }
    s->mounted = 1;
    return 0;
}

static PyObject *session_loop(Session *s, PyObject *args) {
    unsigned int max_threads, max_idle;
    if (!PyArg_ParseTuple(args, "II", &max_threads, &max_idle))
        return NULL;
    if (s->se == NULL || !s->mounted) {
        PyErr_SetString(PyExc_RuntimeError, "not mounted");
        return NULL;
    }
    if (fuse_set_signal_handlers(s->se) != 0) {
        PyErr_SetString(PyExc_OSError, "cannot install the signal handlers");
        return NULL;
    }
    struct fuse_loop_config *cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(cfg, max_threads);
    fuse_loop_cfg_set_idle_threads(cfg, max_idle);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fuse_session_loop_mt(s->se, cfg);
    Py_END_ALLOW_THREADS
    fuse_loop_cfg_destroy(cfg);
    fuse_remove_signal_handlers(s->se);
    fuse_session_unmount(s->se);
    s->mounted = 0;
    /* The operations' destroy, here on this thread (libfuse would call it from
     * fuse_session_destroy, whenever the object goes). */
    PyObject *r = PyObject_CallMethod(s->ops, "destroy", "s", "/");
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    return PyLong_FromLong(rc);
}

static PyObject *session_set_table(Session *s, PyObject *args) {
    Table *table;
    if (!PyArg_ParseTuple(args, "O!", &TableType, &table))
        return NULL;
    Py_INCREF(table);
    Table *old = atomic_exchange(&s->table, table);
    /* Requests that entered the old table finish with it; a Python one may wait for the GIL. */
    Py_BEGIN_ALLOW_THREADS
    while (atomic_load(&old->users) != 0)
        sched_yield();
    Py_END_ALLOW_THREADS
    Py_DECREF(old);
    Py_RETURN_NONE;
}

static PyObject *session_invalidate(Session *s, PyObject *args) {
    PyObject *inos;
    if (!PyArg_ParseTuple(args, "O", &inos))
        return NULL;
    PyObject *it = PyObject_GetIter(inos);
    if (it == NULL)
        return NULL;
    PyObject *item;
    long failed = 0;
    while ((item = PyIter_Next(it)) != NULL) {
        unsigned long long ino = PyLong_AsUnsignedLongLong(item);
        Py_DECREF(item);
        if (PyErr_Occurred())
            break;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = fuse_lowlevel_notify_inval_inode(s->se, ino, 0, 0);
        Py_END_ALLOW_THREADS
        failed += rc != 0 && rc != -ENOENT;
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromLong(failed);
}

static PyObject *session_counts(Session *s, PyObject *unused) {
    PyObject *ops = PyDict_New();
    if (ops == NULL)
        return NULL;
    for (int i = 0; i < OP_COUNT; i++) {
        uint64_t n = atomic_load_explicit(&s->counts[i].n, memory_order_relaxed);
        if (n == 0)
            continue;
        PyObject *v = PyLong_FromUnsignedLongLong(n);
        if (v == NULL || PyDict_SetItemString(ops, OP_NAMES[i], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(ops);
            return NULL;
        }
        Py_DECREF(v);
    }
    return Py_BuildValue("{s:N,s:K,s:K,s:K,s:K,s:K}", "fuse_ops", ops, "bytes_served",
                         (unsigned long long)atomic_load(&s->fast_bytes.n), "reads_in_c_from_ram",
                         (unsigned long long)atomic_load(&s->ram_reads.n), "reads_in_c_from_disk",
                         (unsigned long long)atomic_load(&s->disk_reads.n), "pushed_with_open",
                         (unsigned long long)atomic_load(&s->pushes.n), "push_failures",
                         (unsigned long long)atomic_load(&s->push_failures.n));
}

static PyObject *session_exit(Session *s, PyObject *unused) {
    if (s->se)
        fuse_session_exit(s->se);
    Py_RETURN_NONE;
}

static void session_dealloc(Session *s) {
    if (s->se) {
        if (s->mounted)
            fuse_session_unmount(s->se);
        fuse_session_destroy(s->se);
    }
    Table *t = atomic_load(&s->table);
    Py_XDECREF(t);
    Py_XDECREF(s->ops);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMethodDef session_methods[] = {
    {"loop", (PyCFunction)session_loop, METH_VARARGS,
     "loop(max_threads, max_idle_threads) -> 0 when unmounted, the signal number when stopped by one"},
    {"set_table", (PyCFunction)session_set_table, METH_VARARGS, "serve another view from now on"},
    {"invalidate", (PyCFunction)session_invalidate, METH_VARARGS,
     "drop the kernel's cached attributes and listings of these inodes; returns how many failed"},
    {"counts", (PyCFunction)session_counts, METH_NOARGS, "requests answered here, by operation"},
    {"exit", (PyCFunction)session_exit, METH_NOARGS, "end the loop"},
    {NULL}};

static PyTypeObject SessionType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shardfs.fuse._lowlevel.Session",
    .tp_basicsize = sizeof(Session),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Session(ops, table, mountpoint, options, entry_timeout, negative_timeout, push=True): a mounted FUSE "
              "session; push: a member looked up is put in the page cache with the isatty of its open()",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)session_init,
    .tp_dealloc = (destructor)session_dealloc,
    .tp_methods = session_methods,
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_lowlevel",
                                    "The request loop of shardfs on libfuse's low-level API.", -1, NULL};

PyMODINIT_FUNC PyInit__lowlevel(void) {
    if (PyType_Ready(&SlotType) < 0 || PyType_Ready(&TableType) < 0 || PyType_Ready(&SessionType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&MODULE);
    if (m == NULL)
        return NULL;
    Py_INCREF(&SlotType);
    Py_INCREF(&TableType);
    Py_INCREF(&SessionType);
    if (PyModule_AddObject(m, "Slot", (PyObject *)&SlotType) < 0 ||
        PyModule_AddObject(m, "Table", (PyObject *)&TableType) < 0 ||
        PyModule_AddObject(m, "Session", (PyObject *)&SessionType) < 0 ||
        PyModule_AddIntConstant(m, "CHUNK_LOADED", CHUNK_LOADED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
