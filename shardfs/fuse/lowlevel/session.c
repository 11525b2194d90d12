/* Session: the mount (libfuse's low-level session, the current Table, the counters) and the
 * module shardfs.fuse._lowlevel. */
#include "lowlevel.h"

const char *OP_NAMES[OP_COUNT] = {"lookup", "getattr", "opendir", "readdir", "read", "ioctl",
                                         "statfs", "getxattr", "listxattr", "readlink", "forget", "erofs"};

static int session_init(Session *s, PyObject *args, PyObject *kwds) {
    PyObject *ops;
    Table *table;
    const char *mountpoint, *options;
    double entry_timeout, negative_timeout;
    int push = 1, plus = 1;
    static char *kwlist[] = {"ops", "table", "mountpoint", "options", "entry_timeout", "negative_timeout", "push",
                             "readdirplus", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!ssdd|pp", kwlist, &ops, TableType, &table, &mountpoint,
                                     &options, &entry_timeout, &negative_timeout, &push, &plus))
        return -1;
    if (libfuse.session_new == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "libfuse is not bound yet (shardfs.fuse.lib.libfuse())");
        return -1;
    }
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
    s->readdirplus = plus;
    char *argv[] = {"shardfs", "-o", (char *)options, NULL};
    struct fuse_args fargs = {.argc = 3, .argv = argv};
    s->se = libfuse.session_new(&fargs, &LL_OPS, libfuse.ops_size, s);
    if (s->se == NULL) {
        PyErr_Format(PyExc_OSError, "libfuse refused the options %s (see the lines above)", options);
        return -1;
    }
    if (libfuse.session_mount(s->se, mountpoint) != 0) {
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
    if (libfuse.set_signal_handlers(s->se) != 0) {
        PyErr_SetString(PyExc_OSError, "cannot install the signal handlers");
        return NULL;
    }
    int rc;
    if (libfuse.loop_cfg_create) { /* 3.12: the pool never grows past max_threads */
        struct fuse_loop_config *cfg = libfuse.loop_cfg_create();
        libfuse.loop_cfg_set_max_threads(cfg, max_threads);
        libfuse.loop_cfg_set_idle_threads(cfg, max_idle);
        Py_BEGIN_ALLOW_THREADS
        rc = libfuse.session_loop_mt_312(s->se, cfg);
        Py_END_ALLOW_THREADS
        libfuse.loop_cfg_destroy(cfg);
    } else { /* before 3.12 libfuse starts a worker whenever all are busy: no cap */
        struct fuse_loop_config_v1 cfg = {.clone_fd = 0, .max_idle_threads = max_idle};
        Py_BEGIN_ALLOW_THREADS
        rc = libfuse.session_loop_mt_32(s->se, &cfg);
        Py_END_ALLOW_THREADS
    }
    libfuse.remove_signal_handlers(s->se);
    libfuse.session_unmount(s->se);
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
    if (!PyArg_ParseTuple(args, "O!", TableType, &table))
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
        rc = libfuse.lowlevel_notify_inval_inode(s->se, ino, 0, 0);
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
    return Py_BuildValue("{s:N,s:K,s:K,s:K,s:K,s:K,s:K}", "fuse_ops", ops, "bytes_served",
                         (unsigned long long)atomic_load(&s->fast_bytes.n), "reads_in_c_from_ram",
                         (unsigned long long)atomic_load(&s->ram_reads.n), "reads_in_c_from_disk",
                         (unsigned long long)atomic_load(&s->disk_reads.n), "disk_tier_page_cache_reads",
                         (unsigned long long)atomic_load(&s->disk_cached_reads.n), "pushed_with_open",
                         (unsigned long long)atomic_load(&s->pushes.n), "push_failures",
                         (unsigned long long)atomic_load(&s->push_failures.n));
}

static PyObject *session_exit(Session *s, PyObject *unused) {
    if (s->se)
        libfuse.session_exit(s->se);
    Py_RETURN_NONE;
}

static void session_dealloc(Session *s) {
    if (s->se) {
        if (s->mounted)
            libfuse.session_unmount(s->se);
        libfuse.session_destroy(s->se);
    }
    Table *t = atomic_load(&s->table);
    Py_XDECREF(t);
    Py_XDECREF(s->ops);
    free_object((PyObject *)s);
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

static PyType_Slot session_slots[] = {
    {Py_tp_doc, "Session(ops, table, mountpoint, options, entry_timeout, negative_timeout, push=True, readdirplus=True): "
                "a mounted FUSE session; push: a member looked up is put in the page cache with the isatty of its "
                "open(); readdirplus: listings carry attributes (False: plain READDIR, for comparisons)"},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, session_init},
    {Py_tp_dealloc, session_dealloc},
    {Py_tp_methods, session_methods},
    {0, NULL}};

PyTypeObject *SessionType;
PyType_Spec SESSION_SPEC = {"shardfs.fuse._lowlevel.Session", sizeof(Session), 0, Py_TPFLAGS_DEFAULT,
                            session_slots};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_lowlevel",
                                    "The request loop of shardfs on libfuse's low-level API.", -1, LIBFUSE_METHODS};

/* The type made from spec, in *type and in the module as name. */
static int add_type(PyObject *m, const char *name, PyType_Spec *spec, PyTypeObject **type) {
    *type = (PyTypeObject *)PyType_FromSpec(spec);
    if (*type == NULL)
        return -1;
    Py_INCREF(*type); /* one for *type, one that PyModule_AddObject takes */
    if (PyModule_AddObject(m, name, (PyObject *)*type) < 0) {
        Py_DECREF(*type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__lowlevel(void) {
    if (zlib_bind() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&MODULE);
    if (m == NULL)
        return NULL;
    if (add_type(m, "Slot", &SLOT_SPEC, &SlotType) < 0 || add_type(m, "Table", &TABLE_SPEC, &TableType) < 0 ||
        add_type(m, "Session", &SESSION_SPEC, &SessionType) < 0 ||
        PyModule_AddIntConstant(m, "CHUNK_LOADED", CHUNK_LOADED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
