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
 * Files (lowlevel.h declares what they share):
 *   slot.c      Slot: one shard's bytes in the RAM cache, published while resident (pinned while
 *               read), and its disk-tier file
 *   table.c     Table: one view, the arrays of shardfs.view.tree plus one Slot per shard
 *   requests.c  this file: the answer to each request
 *   session.c   Session: the mount (the libfuse session, the current Table, per-op counters) and
 *               the Python module
 *   libfuse.c   the node's libfuse3, bound when shardfs starts (libfuse.h: our declarations of
 *               its API; calls read libfuse.reply_err(...) for fuse_reply_err(...))
 */
#include "lowlevel.h"

Table *table_enter(Session *s) {
    for (;;) {
        Table *t = atomic_load(&s->table);
        atomic_fetch_add(&t->users, 1);
        if (atomic_load(&s->table) == t)
            return t;
        atomic_fetch_sub(&t->users, 1);
    }
}

void table_leave(Table *t) { atomic_fetch_sub(&t->users, 1); }

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

/* Replies the errno of the Python exception set (python_errno) and lets go of the GIL. */
static void reply_python_error(fuse_req_t req, PyGILState_STATE g) {
    int err = python_errno();
    PyGILState_Release(g);
    libfuse.reply_err(req, err);
}

/* ops.<method>(b"/path", *extra) with the GIL; NULL with *err set on failure. */
static PyObject *call_ops(Session *s, Table *t, uint32_t node, const char *method, const char *fmt, ...) {
    const char *path;
    size_t len;
    node_path(t, node, &path, &len);
    PyObject *p = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len + 1);
    if (p == NULL)
        return NULL;
    char *buf = PyBytes_AsString(p);
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
        PyObject *argv = PyTuple_New(1 + PyTuple_Size(extra));
        if (argv == NULL) {
            Py_DECREF(p);
            Py_DECREF(extra);
            return NULL;
        }
        PyTuple_SetItem(argv, 0, p); /* SetItem steals: fills a new tuple as SET_ITEM would */
        for (Py_ssize_t i = 0; i < PyTuple_Size(extra); i++) {
            PyObject *item = PyTuple_GetItem(extra, i);
            Py_INCREF(item);
            PyTuple_SetItem(argv, i + 1, item);
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

static Session *session_of(fuse_req_t req) { return (Session *)libfuse.req_userdata(req); }

/* The table and node of ino for a request; on ENOENT replies and returns -1 (table left). */
static int64_t enter_node(fuse_req_t req, fuse_ino_t ino, Table **table) {
    Table *t = *table = table_enter(session_of(req));
    int64_t n = resolve(t, ino);
    if (n < 0) {
        table_leave(t);
        libfuse.reply_err(req, ENOENT);
    }
    return n;
}

/* The same for a directory; on ENOENT or ENOTDIR replies and returns -1 (table left). */
static int64_t enter_dir(fuse_req_t req, fuse_ino_t ino, Table **table) {
    int64_t d = enter_node(req, ino, table);
    if (d >= 0 && d >= (*table)->ndirs) {
        table_leave(*table);
        libfuse.reply_err(req, ENOTDIR);
        return -1;
    }
    return d;
}

/* An xattr value, or its size when asked for 0 bytes. */
static void reply_xattr(fuse_req_t req, size_t size, const char *value, size_t len) {
    if (size == 0)
        libfuse.reply_xattr(req, len);
    else if (size < len)
        libfuse.reply_err(req, ERANGE);
    else
        libfuse.reply_buf(req, value, len);
}

static void ll_init(void *userdata, struct fuse_conn_info *conn) {
    Session *s = userdata;
    /* Always readdirplus: with "auto" the kernel asks for attributes only in the first batch of
     * a large directory, and each file listed after it costs a LOOKUP when opened. */
    if (s->readdirplus && (conn->capable & FUSE_CAP_READDIRPLUS))
        conn->want = (conn->want | FUSE_CAP_READDIRPLUS) & ~FUSE_CAP_READDIRPLUS_AUTO;
    else if (!s->readdirplus)
        conn->want &= ~(FUSE_CAP_READDIRPLUS | FUSE_CAP_READDIRPLUS_AUTO);
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
    int64_t d = enter_dir(req, parent, &t);
    if (d < 0)
        return;
    struct fuse_entry_param e;
    int64_t n = find_child(t, (uint32_t)d, name);
    if (n >= 0) {
        entry_of(s, t, (uint32_t)n, &e);
        if (s->push && pushable(t, (uint32_t)n))
            mark_unread(t, (uint32_t)n);
    } else { /* a negative entry, cached for a while: names tried in vain cost nothing */
        memset(&e, 0, sizeof e);
        e.entry_timeout = s->negative_timeout;
    }
    table_leave(t);
    libfuse.reply_entry(req, &e);
}

static void ll_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
    COUNT(session_of(req), OP_FORGET); /* the arrays outlive every node: nothing to free */
    libfuse.reply_none(req);
}

static void ll_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets) {
    COUNT(session_of(req), OP_FORGET);
    libfuse.reply_none(req);
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
    libfuse.reply_attr(req, &st, s->entry_timeout);
}

static void ll_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    /* ENOSYS: the kernel stops sending OPENDIR/RELEASEDIR for this mount, and opens every
     * directory with FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR (fs/fuse/file.c, "default for no-open"):
     * it keeps each listing in the directory's page cache, so the next listing never reaches us.
     * A rescan invalidates them (Session.invalidate). */
    COUNT(session_of(req), OP_OPENDIR);
    libfuse.reply_err(req, ENOSYS);
}

static void readdir_common(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, int plus) {
    Session *s = session_of(req);
    COUNT(s, OP_READDIR);
    Table *t;
    int64_t d = enter_dir(req, ino, &t);
    if (d < 0)
        return;
    char *buf = malloc(size);
    if (buf == NULL) {
        table_leave(t);
        libfuse.reply_err(req, ENOMEM);
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
            child_name(t, (uint32_t)d, n, &name, &len);
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
            need = libfuse.add_direntry_plus(req, buf + used, room, namebuf, &e, i + 1);
            if (i >= 2 && need <= room && s->push && pushable(t, n))
                mark_unread(t, n); /* the kernel makes its inode from this entry */
        } else {
            struct stat st;
            fill_stat(t, n, &st);
            need = libfuse.add_direntry(req, buf + used, room, namebuf, &st, i + 1);
        }
        if (need > room)
            break; /* the kernel's buffer is full: it asks again from this offset */
        used += need;
    }
    table_leave(t);
    libfuse.reply_buf(req, buf, used);
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
    libfuse.reply_err(req, ENOSYS);
}

static void ll_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    libfuse.reply_err(req, ENOSYS);
}

static void read_in_python(Session *s, fuse_req_t req, Table *t, uint32_t n, size_t size, off_t off) {
    PyGILState_STATE g = python_enter();
    PyObject *data = call_ops(s, t, n, "read", "(nLO)", (Py_ssize_t)size, (long long)off, Py_None);
    if (data == NULL) {
        reply_python_error(req, g);
        return;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        int err = python_errno();
        Py_DECREF(data);
        PyGILState_Release(g);
        libfuse.reply_err(req, err);
        return;
    }
    if ((size_t)view.len > size) {
        PyBuffer_Release(&view);
        Py_DECREF(data);
        PyErr_Format(PyExc_RuntimeError, "read returned %zd bytes, more than the %zu asked for", view.len, size);
        PyErr_Print();
        PyGILState_Release(g);
        libfuse.reply_err(req, EIO);
        return;
    }
    /* The buffer (a view of the RAM cache, or bytes) stays alive until the reply is written. */
    Py_BEGIN_ALLOW_THREADS
    libfuse.reply_buf(req, view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    Py_DECREF(data);
    PyGILState_Release(g);
}

/* Bytes of a member answered without Python: pinned in the RAM cache, or read from the disk
 * tier into a buffer. fast_bytes fills one of these; fast_release lets go of it, fast_count counts it. */
typedef struct {
    Slot *slot;
    char *blocks; /* the disk tier's buffer, NULL for RAM */
    size_t room;
    int cached; /* the disk tier's bytes came from its page cache */
} Fast;

static const char *fast_bytes(const Table *t, uint32_t m, int64_t off, size_t len, Fast *f) {
    uint32_t shard = t->shard[m];
    Slot *slot = f->slot = t->slots[shard];
    f->blocks = NULL;
    f->room = 0;
    f->cached = 0;
    /* offset -1: not one byte range of the shard (a sparse file, table.py): Python assembles it. */
    if (!len || !t->shard_raw[shard] || !slot || t->offset[m] < 0)
        return NULL;
    const char *bytes = slot_pin(slot, t->offset[m] + off, len);
    if (bytes || !atomic_load(&slot->direct))
        return bytes;
    f->blocks = slot_read_file(slot, t->offset[m] + off, len, &bytes, &f->room, &f->cached);
    return f->blocks ? bytes : NULL;
}

/* Done with the bytes: unpinned, or their buffer freed. */
static void fast_release(Fast *f) {
    if (f->blocks)
        file_buffer_done(f->blocks, f->room);
    else
        atomic_fetch_sub(&f->slot->pins, 1);
}

/* Counts bytes served from f's slot; served: the counter of how (NULL: as a READ's answer, from RAM
 * or the disk tier). */
static void fast_count(Session *s, const Fast *f, size_t len, Counter *served) {
    Slot *slot = f->slot;
    if (f->blocks) {
        atomic_fetch_add_explicit(&slot->disk_hits, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&slot->disk_bytes, len, memory_order_relaxed);
        if (f->cached)
            atomic_fetch_add_explicit(&s->disk_cached_reads.n, 1, memory_order_relaxed);
    } else {
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
        libfuse.reply_err(req, EISDIR);
        return;
    }
    uint32_t m = (uint32_t)n - t->ndirs;
    int64_t left = t->size[m] - off;
    size_t len = left <= 0 ? 0 : (size_t)left < size ? (size_t)left : size;
    take_unread(t, (uint32_t)n); /* its pages are filling now: nothing to push later */
    Fast f;
    const char *bytes = fast_bytes(t, m, off, len, &f);
    if (bytes) {
        libfuse.reply_buf(req, bytes, len);
        fast_release(&f);
        fast_count(s, &f, len, NULL);
        COUNT(s, OP_READ);
        table_leave(t);
        return;
    }
    /* Python counts the reads it serves (and their errors) itself. */
    read_in_python(s, req, t, (uint32_t)n, size, off);
    table_leave(t);
}

/* A member whose inode the kernel made just now (a lookup, or a listing's READDIRPLUS) has no
 * cached pages, and Python's open() asks isatty (an ioctl) before it reads: when the member's
 * bytes are at hand, they go into the kernel's page cache with the ioctl's answer
 * (FUSE_NOTIFY_STORE), and the read that follows is answered by the kernel, with no READ request.
 * A lookup's reply cannot carry them: the inode exists only once the kernel has processed it. */
static void push_member(Session *s, Table *t, uint32_t n, fuse_ino_t ino) {
    uint32_t m = n - t->ndirs;
    size_t len = (size_t)t->size[m];
    Fast f;
    const char *bytes = fast_bytes(t, m, 0, len, &f);
    if (bytes) {
        struct fuse_bufvec bv = {.count = 1, .buf = {{.size = len, .mem = (void *)bytes, .fd = -1}}};
        int rc = libfuse.lowlevel_notify_store(s->se, ino, 0, &bv, 0);
        fast_release(&f);
        if (rc == 0)
            fast_count(s, &f, len, &s->pushes);
        else /* the READ that follows brings them */
            atomic_fetch_add_explicit(&s->push_failures.n, 1, memory_order_relaxed);
    }
}

static void ll_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void *arg, struct fuse_file_info *fi,
                     unsigned flags, const void *in_buf, size_t in_bufsz, size_t out_bufsz) {
    /* Every Python open() asks isatty() (TCGETS): "not a terminal", without leaving C. */
    Session *s = session_of(req);
    COUNT(s, OP_IOCTL);
    if (s->push) {
        Table *t = table_enter(s);
        int64_t n = resolve(t, ino);
        if (n >= t->ndirs && take_unread(t, (uint32_t)n))
            push_member(s, t, (uint32_t)n, ino);
        table_leave(t);
    }
    libfuse.reply_err(req, ENOTTY);
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
    libfuse.reply_statfs(req, &st);
}

/* ops.<method>(path of ino[, name]) with the GIL taken (*g): the result, or NULL once the error is
 * replied (ENOENT for an unknown ino; the exception's errno) and the GIL let go. */
static PyObject *ask_python(fuse_req_t req, fuse_ino_t ino, const char *method, const char *name,
                            PyGILState_STATE *g) {
    Table *t;
    int64_t n = enter_node(req, ino, &t);
    if (n < 0)
        return NULL;
    *g = python_enter();
    Session *s = session_of(req);
    PyObject *r = name ? call_ops(s, t, (uint32_t)n, method, "(s)", name) : call_ops(s, t, (uint32_t)n, method, NULL);
    table_leave(t);
    if (r == NULL)
        reply_python_error(req, *g);
    return r;
}

static void ll_readlink(fuse_req_t req, fuse_ino_t ino) {
    COUNT(session_of(req), OP_READLINK);
    PyGILState_STATE g;
    PyObject *r = ask_python(req, ino, "readlink", NULL, &g);
    if (r == NULL)
        return;
    PyObject *target = PyUnicode_Check(r) ? PyUnicode_EncodeFSDefault(r) : (Py_INCREF(r), r);
    Py_DECREF(r);
    if (target == NULL || !PyBytes_Check(target)) {
        Py_XDECREF(target);
        PyErr_Clear();
        PyGILState_Release(g);
        libfuse.reply_err(req, EIO);
        return;
    }
    libfuse.reply_readlink(req, PyBytes_AsString(target));
    Py_DECREF(target);
    PyGILState_Release(g);
}

static void ll_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size) {
    COUNT(session_of(req), OP_GETXATTR);
    if (strncmp(name, "user.shardfs.", 13) != 0) { /* ls -l asks every file for ACLs and labels */
        Table *t;
        if (enter_node(req, ino, &t) < 0)
            return;
        table_leave(t);
        libfuse.reply_err(req, ENODATA);
        return;
    }
    PyGILState_STATE g;
    PyObject *r = ask_python(req, ino, "getxattr", name, &g);
    if (r == NULL)
        return;
    if (!PyBytes_Check(r)) {
        Py_DECREF(r);
        PyGILState_Release(g);
        libfuse.reply_err(req, EIO);
        return;
    }
    reply_xattr(req, size, PyBytes_AsString(r), (size_t)PyBytes_Size(r));
    Py_DECREF(r);
    PyGILState_Release(g);
}

static void ll_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
    COUNT(session_of(req), OP_LISTXATTR);
    PyGILState_STATE g;
    PyObject *r = ask_python(req, ino, "listxattr", NULL, &g);
    if (r == NULL)
        return;
    /* "a\0b\0" from ["a", "b"] */
    PyObject *joined = NULL, *sep = PyUnicode_FromStringAndSize("\0", 1);
    PyObject *body = sep ? PyUnicode_Join(sep, r) : NULL;
    if (body != NULL) {
        joined = PyUnicode_GetLength(body) ? PyUnicode_FromFormat("%U%c", body, 0) : (Py_INCREF(body), body);
        Py_DECREF(body);
    }
    Py_XDECREF(sep);
    Py_DECREF(r);
    PyObject *bytes = joined ? PyUnicode_EncodeFSDefault(joined) : NULL;
    Py_XDECREF(joined);
    if (bytes == NULL) {
        reply_python_error(req, g);
        return;
    }
    reply_xattr(req, size, PyBytes_AsString(bytes), (size_t)PyBytes_Size(bytes));
    Py_DECREF(bytes);
    PyGILState_Release(g);
}

/* Read-only means read-only: every write answers EROFS (the mount is "ro" as well). */
#define REFUSE(req)                                   \
    do {                                              \
        COUNT(session_of(req), OP_WRITE_REFUSED);     \
        libfuse.reply_err(req, EROFS);                   \
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

const struct fuse_lowlevel_ops LL_OPS = {
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
