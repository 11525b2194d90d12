/* Binding the node's libfuse3 at run time (dlopen): the loop carries its own declarations
 * (libfuse.h) and needs no libfuse at build time, and one build runs on every libfuse3 from 3.3.
 * shardfs.fuse.lib chooses the library and checks its version; this file opens it and finds the
 * functions. */
#include "lowlevel.h"

struct libfuse libfuse;
static void *handle;

/* A function of libfuse; version: the symbol version to take where libfuse has several (NULL:
 * the default one). */
typedef struct {
    void **slot;
    const char *name, *version;
} Symbol;

#define SYM(field, name) {(void **)&libfuse.field, name, NULL}
#define SYMV(field, name, version) {(void **)&libfuse.field, name, version}

static const Symbol REQUIRED[] = {
    SYM(pkgversion, "fuse_pkgversion"),
    SYM(session_new, "fuse_session_new"),
    SYM(session_mount, "fuse_session_mount"),
    SYM(session_unmount, "fuse_session_unmount"),
    SYM(session_destroy, "fuse_session_destroy"),
    SYM(session_exit, "fuse_session_exit"),
    SYM(set_signal_handlers, "fuse_set_signal_handlers"),
    SYM(remove_signal_handlers, "fuse_remove_signal_handlers"),
    /* struct fuse_loop_config_v1: 3.2 to 3.11, kept by newer versions under this version */
    SYMV(session_loop_mt_32, "fuse_session_loop_mt", "FUSE_3.2"),
    SYM(lowlevel_notify_inval_inode, "fuse_lowlevel_notify_inval_inode"),
    SYM(lowlevel_notify_store, "fuse_lowlevel_notify_store"),
    SYM(req_userdata, "fuse_req_userdata"),
    SYM(reply_err, "fuse_reply_err"),
    SYM(reply_none, "fuse_reply_none"),
    SYM(reply_entry, "fuse_reply_entry"),
    SYM(reply_attr, "fuse_reply_attr"),
    SYM(reply_readlink, "fuse_reply_readlink"),
    SYM(reply_buf, "fuse_reply_buf"),
    SYM(reply_statfs, "fuse_reply_statfs"),
    SYM(reply_xattr, "fuse_reply_xattr"),
    SYM(add_direntry, "fuse_add_direntry"),
    SYM(add_direntry_plus, "fuse_add_direntry_plus"),
};

/* The thread pool settings of 3.12 (max_threads among them): all of them, or none. */
static const Symbol LOOP_CONFIG[] = {
    SYMV(session_loop_mt_312, "fuse_session_loop_mt", "FUSE_3.12"),
    SYM(loop_cfg_create, "fuse_loop_cfg_create"),
    SYM(loop_cfg_destroy, "fuse_loop_cfg_destroy"),
    SYM(loop_cfg_set_max_threads, "fuse_loop_cfg_set_max_threads"),
    SYM(loop_cfg_set_idle_threads, "fuse_loop_cfg_set_idle_threads"),
};

#define COUNT_OF(a) (sizeof(a) / sizeof(*(a)))

static void *find(const Symbol *sym) {
    return sym->version ? dlvsym(handle, sym->name, sym->version) : dlsym(handle, sym->name);
}

/* Finds every symbol of group; returns the first one missing (and binds nothing), or NULL. */
static const Symbol *bind_group(const Symbol *group, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (find(&group[i]) == NULL)
            return &group[i];
    for (size_t i = 0; i < n; i++)
        *group[i].slot = find(&group[i]);
    return NULL;
}

/* The release of the library (major * 100 + minor), at least: fuse_version() said 302 from 3.2 to
 * 3.9, and 3.6.0's fuse_pkgversion() says "3.0.0"; each newer symbol version is a floor. */
static const struct {
    const char *name, *version;
    int release;
} FLOORS[] = {
    {"fuse_open_channel", "FUSE_3.3", 303},
    {"fuse_fs_copy_file_range", "FUSE_3.4", 304},
    {"fuse_log", "FUSE_3.7", 307},
    {"fuse_loop_cfg_create", "FUSE_3.12", 312},
};

static int release_of(void *h, int version) {
    int release = version, major, minor;
    const char *(*pkgversion)(void) = (const char *(*)(void))dlsym(h, "fuse_pkgversion");
    if (pkgversion && sscanf(pkgversion(), "%d.%d", &major, &minor) == 2 && major == 3 && major * 100 + minor > release)
        release = major * 100 + minor;
    for (size_t i = 0; i < sizeof FLOORS / sizeof *FLOORS; i++)
        if (FLOORS[i].release > release && dlvsym(h, FLOORS[i].name, FLOORS[i].version))
            release = FLOORS[i].release;
    return release;
}

static PyObject *libfuse_open(PyObject *module, PyObject *args) {
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name))
        return NULL;
    void *h = handle ? handle : dlopen(name, RTLD_NOW | RTLD_LOCAL); /* once per process: one libfuse */
    if (h == NULL) {
        PyErr_SetString(PyExc_OSError, dlerror());
        return NULL;
    }
    void *version = dlsym(h, "fuse_version");
    Dl_info where;
    if (version == NULL || dladdr(version, &where) == 0 || where.dli_fname == NULL) {
        PyErr_Format(PyExc_OSError, "%s has no fuse_version(): not libfuse", name);
        if (h != handle)
            dlclose(h);
        return NULL;
    }
    handle = h;
    *(void **)&libfuse.version = version;
    libfuse.release = release_of(h, libfuse.version());
    return Py_BuildValue("(si)", where.dli_fname, libfuse.release);
}

static PyObject *libfuse_bind(PyObject *module, PyObject *unused) {
    if (handle == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "libfuse_open first");
        return NULL;
    }
    if (libfuse.release < LIBFUSE_MIN_VERSION) {
        PyErr_Format(PyExc_OSError, "libfuse %d is older than %d", libfuse.release, LIBFUSE_MIN_VERSION);
        return NULL;
    }
    if (libfuse.session_new == NULL) {
        const Symbol *missing = bind_group(REQUIRED, COUNT_OF(REQUIRED));
        if (missing != NULL) {
            PyErr_Format(PyExc_OSError, "libfuse has no %s%s%s", missing->name, missing->version ? "@" : "",
                         missing->version ? missing->version : "");
            return NULL;
        }
        bind_group(LOOP_CONFIG, COUNT_OF(LOOP_CONFIG));
        libfuse.ops_size = libfuse.release >= 304 ? sizeof(struct fuse_lowlevel_ops)
                                                    : offsetof(struct fuse_lowlevel_ops, copy_file_range);
    }
    return Py_BuildValue("(sO)", libfuse.pkgversion(), libfuse.loop_cfg_create ? Py_True : Py_False);
}

PyMethodDef LIBFUSE_METHODS[] = {
    {"libfuse_open", libfuse_open, METH_VARARGS,
     "libfuse_open(name) -> (path, release: major * 100 + minor): dlopen libfuse3 (a path, or a name the loader searches); "
     "later calls return the library opened first"},
    {"libfuse_bind", libfuse_bind, METH_NOARGS,
     "libfuse_bind() -> (package version, has the 3.12 loop settings): find the functions the loop calls"},
    {NULL}};
