/* The tar scanner's fast path: plain ustar/GNU headers parsed in C, many per call.
 *
 * scan(chunk, start, base, shard_size, small_max) parses headers from chunk[start:] (chunk[0] is
 * at offset `base` of the shard) as long as each is one tar.py would read the plain way: a valid
 * octal checksum; a regular file, folder, symlink or hard link; octal numbers only; the member
 * whole within the shard. It stops before the first header that is anything else (an extended
 * header, GNU long names, sparse, a bad checksum, a zero block, base-256 numbers, a truncated
 * member...) and tar.py reads that one with its own code, so GNU, PAX, sparse and damaged archives
 * keep exactly its semantics. It also stops where the chunk ends (where a member's data goes past
 * the chunk, or a small member's data is not all in it).
 *
 * Returns (stop, reason, names, numbers, links, smalls, above): stop is where it stopped, as an offset
 * into the chunk (past its end when the last member's data goes on after it); reason is 0 where
 * the chunk ended, 1 before a header to read the plain way; numbers holds NFIELDS int64 per member
 * (see below); names, links and smalls hold back to back the names (ustar prefix joined), link
 * targets and the data of files of at most small_max bytes (kept: labels); above holds the path
 * hashes (uint64) of the folders above the members' parents (every "/"-prefix of a normal name
 * shorter than its parent folder), each at least once (index/plain.py: no file where a folder must be).
 * The parse runs without the GIL: the chunk is a bytes object, or a buffer that its caller alone
 * writes (tar.py: its thread's read buffer), held by the call.
 *
 * Limited API (3.10): one abi3 build serves every Python from 3.10. */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../pybuffer310.h"
#include "_names.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The thread keys moved from libpthread into libc in glibc 2.34 under a new symbol version; bound
 * to their first one (x86_64: GLIBC_2.2.5, which libc keeps, and setup.py links libpthread.so.0,
 * where older glibc has them), the module loads on glibc 2.17 and newer (the wheel's manylinux2014
 * tag), as the request loop does with dlopen (fuse/lowlevel/lowlevel.h). */
#if defined(__x86_64__) && defined(__GLIBC__)
__asm__(".symver pthread_key_create,pthread_key_create@GLIBC_2.2.5");
__asm__(".symver pthread_getspecific,pthread_getspecific@GLIBC_2.2.5");
__asm__(".symver pthread_setspecific,pthread_setspecific@GLIBC_2.2.5");
#endif

#define BLOCK 512
enum { STOP_CHUNK_END = 0, STOP_PLAIN_WAY = 1 };

/* tar.py's _number for octal fields: the text before the first NUL, spaces stripped at both ends,
 * digits 0-7 only (empty: 0). -1 for anything else (base-256, other characters): the plain way. */
static int64_t octal(const unsigned char *field, int width) {
    int end = 0;
    while (end < width && field[end] != 0)
        end++;
    int at = 0;
    while (at < end && field[at] == ' ')
        at++;
    while (end > at && field[end - 1] == ' ')
        end--;
    int64_t value = 0;
    for (; at < end; at++) {
        if (field[at] < '0' || field[at] > '7')
            return -1;
        value = value * 8 + (field[at] - '0');
    }
    return value;
}

static size_t field_len(const unsigned char *field, size_t width) {
    const unsigned char *nul = memchr(field, 0, width);
    return nul ? (size_t)(nul - field) : width;
}

static int checksum_ok(const unsigned char *h) {
    int64_t want = octal(h + 148, 8);
    /* tar.py wants digits: an empty field (a zero block) is not a checksum */
    if (want < 0)
        return 0;
    int has_digit = 0;
    for (int i = 148; i < 156 && h[i]; i++)
        has_digit |= h[i] != ' ';
    if (!has_digit)
        return 0;
    /* the sums with the checksum field read as spaces; signed: bytes over 127 count 256 less */
    uint32_t unsigned_sum = 0, high = 0;
    for (int i = 0; i < BLOCK; i++) {
        unsigned_sum += h[i];
        high += h[i] >> 7;
    }
    for (int i = 148; i < 156; i++) {
        unsigned_sum -= h[i];
        high -= h[i] >> 7;
    }
    unsigned_sum += 8 * ' ';
    int64_t signed_sum = (int64_t)unsigned_sum - 256 * (int64_t)high;
    return want == (int64_t)unsigned_sum || want == signed_sum;
}

/* What scan() hands back, back to back (see the top of this file). */
typedef struct {
    Buf names, numbers, links, smalls, above;
} Parsed;

/* A header tar.py would read the plain way, as parse uses it. */
typedef struct {
    int kind;
    int64_t size, mode, mtime;
    size_t name_len, prefix_len, link_len; /* prefix_len: the ustar prefix, 0 where none */
} Header;

/* Header h's numbers read the plain way: 0, or -1 where tar.py must read it (a bad checksum, a
 * number that is not octal). */
static int plain_numbers(const unsigned char *h, Header *out) {
    if (!checksum_ok(h))
        return -1;
    out->size = octal(h + 124, 12);
    out->mode = octal(h + 100, 8);
    out->mtime = octal(h + 136, 12);
    return out->size < 0 || out->mode < 0 || out->mtime < 0 ? -1 : 0;
}

/* Its kind and the lengths of its names: 0, or -1 where tar.py must read it (a type other than a
 * file, folder or link). */
static int plain_kind(const unsigned char *h, Header *out) {
    out->name_len = field_len(h, 100);
    int ustar_prefix = memcmp(h + 257, "ustar\0", 6) == 0 && h[345] != 0;
    out->prefix_len = ustar_prefix ? field_len(h + 345, 155) : 0;
    unsigned char type = h[156];
    if (type == '0' || type == 0 || type == '7') {
        /* an old-style folder: a regular member whose (joined) name ends in "/" */
        int slash = out->name_len ? h[out->name_len - 1] == '/' : out->prefix_len != 0;
        out->kind = slash ? KIND_DIR : KIND_FILE;
    } else if (type == '5')
        out->kind = KIND_DIR;
    else if (type == '2')
        out->kind = KIND_SYMLINK;
    else if (type == '1')
        out->kind = KIND_HARDLINK;
    else
        return -1;
    out->link_len = (out->kind == KIND_SYMLINK || out->kind == KIND_HARDLINK) ? field_len(h + 157, 100) : 0;
    return 0;
}

/* The member of header h (its data at data_at of the shard; small: its data, kept, else NULL)
 * added to out: its name, link, kept data and row of numbers. -1 if out of memory. */
static int add_member(const unsigned char *h, const Header *hd, int64_t data_at, const unsigned char *small,
                      Parents *p, Parsed *out) {
    size_t name_at = out->names.len;
    if (hd->prefix_len && (buf_add(&out->names, h + 345, hd->prefix_len) || buf_add(&out->names, "/", 1)))
        return -1;
    if (buf_add(&out->names, h, hd->name_len) || buf_add(&out->links, h + 157, hd->link_len) ||
        (small && buf_add(&out->smalls, small, (size_t)hd->size)))
        return -1;
    int64_t row[NFIELDS];
    const unsigned char *name = (const unsigned char *)out->names.data + name_at;
    row[F_KIND] = hd->kind;
    row[F_OFFSET] = hd->kind == KIND_FILE ? data_at : 0;
    row[F_SIZE] = hd->kind == KIND_FILE ? hd->size : hd->kind == KIND_SYMLINK ? (int64_t)hd->link_len : 0;
    row[F_MODE] = hd->mode & 07777;
    row[F_MTIME] = hd->mtime;
    row[F_NAME_END] = (int64_t)out->names.len;
    row[F_LINK_END] = (int64_t)out->links.len;
    row[F_SMALL_END] = small ? (int64_t)out->smalls.len : -1;
    if (fill_name_fields(p, out->names.data, &out->above, name, out->names.len - name_at, row) < 0)
        return -1;
    return buf_add(&out->numbers, row, sizeof row);
}

/* Parses from chunk[pos]; returns the reason it stopped and sets *stop (*failed: out of memory). */
static int parse(const unsigned char *chunk, size_t len, size_t pos, int64_t base, int64_t shard_size,
                 int64_t small_max, Parsed *out, size_t *stop, int *failed) {
    Parents parents;
    memset(&parents, 0, sizeof parents);
    /* headers beyond the shard's end (a chunk is never longer than the shard) are not read */
    size_t limit = len;
    if (shard_size - base < (int64_t)limit)
        limit = shard_size - base < 0 ? 0 : (size_t)(shard_size - base);
    for (;;) {
        *stop = pos;
        if (pos + BLOCK > limit)
            return STOP_CHUNK_END;
        const unsigned char *h = chunk + pos;
        Header hd;
        if (plain_numbers(h, &hd) < 0)
            return STOP_PLAIN_WAY;
        int64_t data_at = base + (int64_t)pos + BLOCK;
        int64_t next = data_at + (hd.size + BLOCK - 1) / BLOCK * BLOCK;
        if (next > shard_size)
            return STOP_PLAIN_WAY; /* truncated: tar.py says what it cuts */
        /* the next header's cache lines asked for now, loaded while this member is hashed: the
         * chunk came from storage by DMA (O_DIRECT), and a header's checksum waited on memory
         * (the hardware prefetcher does not follow the jumps over members' data) */
        if ((size_t)(next - base) + BLOCK <= limit)
            for (int line = 0; line < BLOCK; line += 64)
                __builtin_prefetch(chunk + (next - base) + line);
        if (plain_kind(h, &hd) < 0)
            return STOP_PLAIN_WAY;
        int small = hd.kind == KIND_FILE && hd.size <= small_max;
        if (small && data_at + hd.size > base + (int64_t)len)
            return STOP_CHUNK_END; /* its data (kept, see tar.py) is not all in this chunk */
        if (add_member(h, &hd, data_at, small ? chunk + (data_at - base) : NULL, &parents, out) < 0) {
            *failed = 1;
            return STOP_PLAIN_WAY;
        }
        pos = (size_t)(next - base);
    }
}

/* Each thread's buffers for what scan() parses, kept from call to call (freed with the thread):
 * grown afresh for each chunk, they were new pages each time, faulted in (measured: ~100 page
 * faults a shard of 2,000 members, most of the scan's kernel time). */
enum { SCRATCH_KEPT = 16 << 20 };
static pthread_key_t scratch_key;

/* The buffers of p, to go over them all. */
#define PARSED_BUFS(p) {&(p)->names, &(p)->numbers, &(p)->links, &(p)->smalls, &(p)->above}

static void scratch_free(void *own) {
    Parsed *p = own;
    Buf *bufs[] = PARSED_BUFS(p);
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        free(bufs[i]->data);
    free(p);
}

static Parsed *scratch(void) {
    Parsed *own = pthread_getspecific(scratch_key);
    if (own == NULL && (own = calloc(1, sizeof *own)) != NULL && pthread_setspecific(scratch_key, own) != 0) {
        free(own);
        own = NULL;
    }
    return own;
}

/* y# of a Buf: its bytes, or "" (never NULL) when it holds none */
#define BYTES_OF(b) (b).data ? (b).data : "", (Py_ssize_t)(b).len

static PyObject *scan(PyObject *self, PyObject *args) {
    PyObject *chunk_obj;
    Py_ssize_t start;
    long long base, shard_size, small_max;
    if (!PyArg_ParseTuple(args, "OnLLL", &chunk_obj, &start, &base, &shard_size, &small_max))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(chunk_obj, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const char *chunk = view.buf;
    Py_ssize_t len = view.len;
    if (start < 0 || start > len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "start outside the chunk");
        return NULL;
    }
    Parsed *out = scratch();
    if (out == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    Buf *bufs[] = PARSED_BUFS(out);
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        bufs[i]->len = 0;
    size_t stop = 0;
    int failed = 0, reason;
    Py_BEGIN_ALLOW_THREADS
    reason = parse((const unsigned char *)chunk, (size_t)len, (size_t)start, base, shard_size, small_max, out, &stop,
                   &failed);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    PyObject *result = NULL;
    if (failed)
        PyErr_NoMemory();
    else
        result = Py_BuildValue("(niy#y#y#y#y#)", (Py_ssize_t)stop, reason, BYTES_OF(out->names),
                               BYTES_OF(out->numbers), BYTES_OF(out->links), BYTES_OF(out->smalls),
                               BYTES_OF(out->above));
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]->cap > SCRATCH_KEPT) { /* a rare huge chunk's: not kept for the thread's life */
            free(bufs[i]->data);
            *bufs[i] = (Buf){0};
        }
    return result;
}

/* ---- plain_members: a shard's columns as index/plain.py keeps them (see there) ---- */

/* A set of path hashes (uint64), each with a value: open addressing, linear probing. */
typedef struct {
    uint64_t *keys;
    int64_t *values;
    unsigned char *used;
    size_t mask;
} NameSet;

static int nameset_init(NameSet *s, size_t count) {
    size_t cap = 16;
    while (cap < 2 * count)
        cap *= 2;
    s->keys = malloc(cap * sizeof *s->keys);
    s->values = malloc(cap * sizeof *s->values);
    s->used = calloc(cap, 1);
    s->mask = cap - 1;
    return s->keys && s->values && s->used ? 0 : -1;
}

static void nameset_free(NameSet *s) {
    free(s->keys);
    free(s->values);
    free(s->used);
}

/* The slot of ``key``: its own, or the empty one where it would go. */
static size_t nameset_slot(const NameSet *s, uint64_t key) {
    size_t at = (size_t)(key ^ (key >> 29)) & s->mask;
    while (s->used[at] && s->keys[at] != key)
        at = (at + 1) & s->mask;
    return at;
}

/* key put in the set (its value: value) where it is not yet; 0 where it was there already. */
static int nameset_add(NameSet *s, uint64_t key, int64_t value) {
    size_t at = nameset_slot(s, key);
    if (s->used[at])
        return 0;
    s->used[at] = 1;
    s->keys[at] = key;
    s->values[at] = value;
    return 1;
}

enum { PLAIN_OK = 0, PLAIN_NO = 1, PLAIN_NOMEM = 2 };

typedef struct {
    int64_t *keep; /* the rows kept (all but "./" itself) */
    size_t nkeep;
    char *blob; /* the normal names back to back; NULL: the names as they are */
    int64_t *name_end;
    uint32_t *parent;
    Buf dirs;
    size_t ndirs;
} Plain;

/* The scan's rows as plain_members_of works on them: the row of kept member k, and where its
 * normal name starts among the normal names back to back (starts[k]: see normal_names). */
typedef struct {
    const char *names;
    size_t names_len;
    const int64_t *rows;
    size_t n;
    int64_t *starts;
    const char *blob; /* the normal names back to back: names itself, or out->blob */
} Rows;

static const int64_t *kept_row(const Rows *r, const Plain *out, size_t k) { return r->rows + out->keep[k] * NFIELDS; }

static uint64_t hash_field(const int64_t *row, int field) {
    uint64_t hash;
    memcpy(&hash, &row[field], sizeof hash);
    return hash;
}

/* The length of a normal name's parent folder ("" for the root). */
static int64_t parent_len(const int64_t *row) {
    return row[F_PARENT_END] >= 0 ? row[F_PARENT_END] - row[F_NORM_START] : 0;
}

/* Files and folders only, every name normal: out->keep lists them ("./" itself, a folder, left out). */
static int keep_rows(const Rows *r, Plain *out) {
    for (size_t i = 0; i < r->n; i++) {
        const int64_t *row = r->rows + i * NFIELDS;
        if (row[F_KIND] != KIND_FILE && row[F_KIND] != KIND_DIR)
            return PLAIN_NO;
        if (row[F_NORM_START] == NOT_NORMAL || (row[F_NORM_START] == ROOT && row[F_KIND] != KIND_DIR))
            return PLAIN_NO;
        if (row[F_NORM_START] != ROOT)
            out->keep[out->nkeep++] = (int64_t)i;
    }
    return PLAIN_OK;
}

/* No name twice (nor two of one hash: replay.py compares the names). */
static int names_distinct(const Rows *r, const Plain *out) {
    NameSet seen;
    int status = PLAIN_NOMEM;
    if (nameset_init(&seen, out->nkeep) == 0) {
        status = PLAIN_OK;
        for (size_t k = 0; k < out->nkeep && status == PLAIN_OK; k++)
            if (!nameset_add(&seen, hash_field(kept_row(r, out, k), F_HASH), 0))
                status = PLAIN_NO;
    }
    nameset_free(&seen);
    return status;
}

/* The normal names back to back (r->blob, r->starts, out->name_end): the names as they are where
 * they are that already, else a copy in out->blob. */
static int normal_names(Rows *r, Plain *out) {
    int as_is = 1;
    int64_t end = 0;
    for (size_t k = 0; k < out->nkeep; k++) {
        size_t i = (size_t)out->keep[k];
        const int64_t *row = r->rows + i * NFIELDS;
        int64_t begin = i ? r->rows[(i - 1) * NFIELDS + F_NAME_END] : 0, len = row[F_NORM_END] - row[F_NORM_START];
        r->starts[k] = end;
        end += len;
        out->name_end[k] = end;
        as_is &= begin + row[F_NORM_START] == r->starts[k];
    }
    as_is &= out->nkeep > 0 && end == (int64_t)r->names_len;
    r->blob = r->names;
    if (as_is)
        return PLAIN_OK;
    if ((out->blob = malloc(end ? (size_t)end : 1)) == NULL)
        return PLAIN_NOMEM;
    for (size_t k = 0; k < out->nkeep; k++) {
        size_t i = (size_t)out->keep[k];
        int64_t begin = i ? r->rows[(i - 1) * NFIELDS + F_NAME_END] : 0;
        memcpy(out->blob + r->starts[k], r->names + begin + r->rows[i * NFIELDS + F_NORM_START],
               (size_t)(out->name_end[k] - r->starts[k]));
    }
    r->blob = out->blob;
    return PLAIN_OK;
}

/* Each member's folder (out->parent, out->dirs), in order of first use, into folders: told apart by
 * hash, each compared byte for byte with the first member of its hash (two folders of one hash:
 * replay.py). */
static int assign_folders(const Rows *r, Plain *out, NameSet *folders) {
    if (nameset_init(folders, out->nkeep) < 0)
        return PLAIN_NOMEM;
    for (size_t k = 0; k < out->nkeep; k++) {
        const int64_t *row = kept_row(r, out, k);
        uint64_t hash = hash_field(row, F_PARENT_HASH);
        int64_t len = parent_len(row);
        size_t at = nameset_slot(folders, hash);
        if (folders->used[at]) {
            size_t first = (size_t)folders->values[at];
            if (len != parent_len(kept_row(r, out, first)) ||
                memcmp(r->blob + r->starts[k], r->blob + r->starts[first], (size_t)len) != 0)
                return PLAIN_NO;
            out->parent[k] = out->parent[first];
            continue;
        }
        nameset_add(folders, hash, (int64_t)k);
        out->parent[k] = (uint32_t)out->ndirs++;
        if ((out->ndirs > 1 && buf_add(&out->dirs, "", 1)) || buf_add(&out->dirs, r->blob + r->starts[k], (size_t)len))
            return PLAIN_NOMEM;
    }
    return PLAIN_OK;
}

/* No file where a folder must be: a parent (in folders), or a folder above one (the scan's ``above``). */
static int no_file_on_a_folder(const Rows *r, const Plain *out, const NameSet *folders, const uint64_t *above,
                               size_t nabove) {
    NameSet taken;
    int status = PLAIN_NOMEM;
    if (nameset_init(&taken, out->ndirs + nabove) == 0) {
        for (size_t at = 0; at <= folders->mask; at++)
            if (folders->used[at])
                nameset_add(&taken, folders->keys[at], 0);
        for (size_t j = 0; j < nabove; j++)
            nameset_add(&taken, above[j], 0);
        status = PLAIN_OK;
        for (size_t k = 0; k < out->nkeep && status == PLAIN_OK; k++) {
            const int64_t *row = kept_row(r, out, k);
            if (row[F_KIND] == KIND_FILE && taken.used[nameset_slot(&taken, hash_field(row, F_HASH))])
                status = PLAIN_NO;
        }
    }
    nameset_free(&taken);
    return status;
}

static int plain_members_of(const char *names, size_t names_len, const int64_t *rows, size_t n,
                            const uint64_t *above, size_t nabove, Plain *out) {
    size_t room = n ? n : 1;
    Rows r = {names, names_len, rows, n, malloc(room * sizeof(int64_t)), NULL};
    out->keep = malloc(room * sizeof *out->keep);
    out->name_end = malloc(room * sizeof *out->name_end);
    out->parent = malloc(room * sizeof *out->parent);
    NameSet folders = {0};
    int status = PLAIN_NOMEM;
    if (out->keep && out->name_end && out->parent && r.starts && (status = keep_rows(&r, out)) == PLAIN_OK &&
        (status = names_distinct(&r, out)) == PLAIN_OK && (status = normal_names(&r, out)) == PLAIN_OK &&
        (status = assign_folders(&r, out, &folders)) == PLAIN_OK)
        status = no_file_on_a_folder(&r, out, &folders, above, nabove);
    free(r.starts);
    nameset_free(&folders);
    return status;
}

/* plain_members(names, rows, above): None where the shard needs replay.py, else (kept, blob,
 * name_end, parent, dirs, ndirs): the rows kept (int64; None: all), the normal names back to
 * back (None: ``names`` as they are), their ends (int64), each one's folder (uint32, into the
 * folders in order of first use), those folders NUL-separated and how many. ``rows``: the scan's
 * numbers (C-contiguous int64, NFIELDS a row). Runs without the GIL. */
static PyObject *plain_members(PyObject *self, PyObject *args) {
    PyObject *names_obj, *rows_obj, *above_obj;
    if (!PyArg_ParseTuple(args, "OOO", &names_obj, &rows_obj, &above_obj))
        return NULL;
    Py_buffer names, rows, above;
    if (PyObject_GetBuffer(names_obj, &names, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(rows_obj, &rows, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&names);
        return NULL;
    }
    if (PyObject_GetBuffer(above_obj, &above, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&names);
        PyBuffer_Release(&rows);
        return NULL;
    }
    PyObject *result = NULL;
    if (rows.len % (NFIELDS * 8) || above.len % 8) {
        PyErr_SetString(PyExc_ValueError, "rows of NFIELDS int64, above of uint64");
        goto out;
    }
    Plain got = {0};
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = plain_members_of(names.buf, (size_t)names.len, rows.buf, (size_t)rows.len / (NFIELDS * 8), above.buf,
                              (size_t)above.len / 8, &got);
    Py_END_ALLOW_THREADS
    if (status == PLAIN_NOMEM)
        PyErr_NoMemory();
    else if (status == PLAIN_NO)
        result = Py_NewRef(Py_None);
    else {
        size_t n = (size_t)rows.len / (NFIELDS * 8);
        PyObject *kept = got.nkeep == n ? Py_NewRef(Py_None)
                                        : PyBytes_FromStringAndSize((char *)got.keep, (Py_ssize_t)(got.nkeep * 8));
        PyObject *blob = got.blob == NULL ? Py_NewRef(Py_None)
                                          : PyBytes_FromStringAndSize(got.blob, got.nkeep ? (Py_ssize_t)got.name_end[got.nkeep - 1] : 0);
        if (kept && blob)
            result = Py_BuildValue("(OOy#y#y#n)", kept, blob, (char *)got.name_end, (Py_ssize_t)(got.nkeep * 8),
                                   (char *)got.parent, (Py_ssize_t)(got.nkeep * 4), got.dirs.data ? got.dirs.data : "",
                                   (Py_ssize_t)got.dirs.len, (Py_ssize_t)got.ndirs);
        Py_XDECREF(kept);
        Py_XDECREF(blob);
    }
    free(got.keep);
    free(got.blob);
    free(got.name_end);
    free(got.parent);
    free(got.dirs.data);
out:
    PyBuffer_Release(&names);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&above);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Parse plain tar headers from a chunk: (stop, reason, names, numbers, links, smalls, above)."},
    {"plain_members", plain_members, METH_VARARGS,
     "A shard's columns as index/plain.py keeps them: None, or (kept, blob, name_end, parent, dirs, ndirs)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_tarscan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__tarscan(void) {
    static int keyed;
    if (!keyed) {
        if (pthread_key_create(&scratch_key, scratch_free) != 0)
            return PyErr_NoMemory();
        keyed = 1;
    }
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "NFIELDS", NFIELDS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
