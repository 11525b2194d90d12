/* Slot: one shard's bytes as the request loop reads them: its buffer in the RAM cache while
 * resident (pinned by each reader while it copies), its disk-tier file while the RAM cache has
 * refused the shard (every block checked against its crc32 record). */
#include "lowlevel.h"

#include <fcntl.h>

/* zlib's crc32, bound at import from the libz.so.1 every system has (Python's zlib module uses
 * it): a wheel that links it would have to carry its own copy (manylinux does not list libz). */
static unsigned long (*crc32)(unsigned long crc, const unsigned char *buf, unsigned int len);

int zlib_bind(void) {
    void *z = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
    if (z != NULL)
        *(void **)&crc32 = dlsym(z, "crc32");
    if (crc32 == NULL) {
        PyErr_Format(PyExc_ImportError, "zlib's crc32 is missing (%s): install zlib (Debian/Ubuntu: zlib1g; "
                     "RHEL/Rocky: zlib)", dlerror());
        return -1;
    }
    return 0;
}

uint64_t now_ns(void) {
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

/* Mappings of tier files (for mincore, below), at most this many: each takes one of the process's
 * vm.max_map_count (65530 by default) that malloc and Python need too, and a dataset may have
 * far more shards. Past it, a tier file is read with O_DIRECT only. */
#define MAX_TIER_MAPS 8192
static _Atomic int tier_maps;

static void slot_release_file(Slot *s) {
    if (!s->fpublished)
        return;
    atomic_store(&s->fd, -1);
    wait_unpinned(s);
    if (s->fmap != NULL) {
        munmap((void *)s->fmap, s->fmap_len);
        atomic_fetch_sub(&tier_maps, 1);
    }
    s->fmap = NULL;
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
    s->fmap_len = (size_t)(data_at + size);
    s->fmap = NULL; /* without a mapping: always O_DIRECT */
    if (atomic_fetch_add(&tier_maps, 1) < MAX_TIER_MAPS) {
        void *map = mmap(NULL, s->fmap_len, PROT_READ, MAP_SHARED, records_fd, 0);
        if (map != MAP_FAILED)
            s->fmap = (const unsigned char *)map;
    }
    if (s->fmap == NULL)
        atomic_fetch_sub(&tier_maps, 1);
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
    free_object((PyObject *)s);
}

/* Pinned bytes [off, off+len) of the shard if every chunk holding them is loaded, else NULL
 * (unpinned). The caller unpins after the reply. */
const char *slot_pin(Slot *s, int64_t off, size_t len) {
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

void file_buffer_done(char *p, size_t need) {
    if (p != NULL && need > KEPT_BUFFER)
        munmap(p, need);
}

/* 1 if [at, at+len) of the disk-tier file was copied from the page cache. In the first epoch the
 * disk tier wrote these bytes moments ago and the kernel still holds them, where an O_DIRECT read
 * would wait for the disk. mincore says whether every page is there
 * without starting any I/O (a buffered read that misses would read the disk itself, and then
 * the O_DIRECT read again). A page dropped between the two calls is read from disk, still right. */
#define MAX_CACHED_PAGES 1024
static int read_cached(Slot *s, char *buf, size_t len, int64_t at) {
    static int64_t page;
    if (page == 0)
        page = sysconf(_SC_PAGESIZE);
    int64_t first = at / page * page, npages = (at + (int64_t)len - first + page - 1) / page;
    unsigned char held[MAX_CACHED_PAGES];
    if (s->fmap == NULL || npages > MAX_CACHED_PAGES ||
        mincore((void *)(s->fmap + first), (size_t)(at + (int64_t)len - first), held) != 0)
        return 0;
    for (int64_t i = 0; i < npages; i++)
        if (!(held[i] & 1))
            return 0;
    return pread(s->records_fd, buf, len, at) == (ssize_t)len;
}

char *slot_read_file(Slot *s, int64_t off, size_t len, const char **out, size_t *room, int *cached) {
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
    *cached = read_cached(s, blocks, (size_t)(stop - begin), s->data_at + begin);
    if (atomic_load(&s->no_o_direct))
        fd = s->records_fd;
    ssize_t got = *cached ? stop - begin : pread(fd, blocks, *room, s->data_at + begin);
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
            unsigned long crc = crc32(0, (const unsigned char *)blocks + (b - begin), (unsigned int)n);
            if ((uint32_t)crc != record[1 + (b - c * s->fchunk) / s->block])
                goto done;
        }
    }
    *out = blocks + (off - begin);
    ok = 1;
    if (*cached) /* the member is in the mounted file's page cache now: not twice. A hint: the kernel
                  * drops only pages wholly inside the range, and no folio that reaches outside it. */
        posix_fadvise(s->records_fd, s->data_at + off, (off_t)len, POSIX_FADV_DONTNEED);
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

static PyType_Slot slot_slots[] = {
    {Py_tp_doc, "One shard's bytes as the request loop reads them: its buffer in the RAM cache, its disk-tier file."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, slot_init},
    {Py_tp_dealloc, slot_dealloc},
    {Py_tp_methods, slot_methods},
    {Py_tp_getset, slot_getset},
    {0, NULL}};

PyTypeObject *SlotType;
PyType_Spec SLOT_SPEC = {"shardfs.fuse._lowlevel.Slot", sizeof(Slot), 0, Py_TPFLAGS_DEFAULT, slot_slots};
