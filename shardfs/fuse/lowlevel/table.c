/* Table: one view of the dataset as the request loop answers from it: the arrays of
 * shardfs.view.tree, lookups (a binary search by name among a directory's children), and
 * attributes. */
#include "lowlevel.h"

void node_path(const Table *t, uint32_t n, const char **p, size_t *len) {
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

void base_name(const Table *t, uint32_t n, const char **p, size_t *len) {
    const char *path;
    size_t plen;
    node_path(t, n, &path, &plen);
    const char *slash = plen ? memrchr(path, '/', plen) : NULL;
    *p = slash ? slash + 1 : path;
    *len = plen - (size_t)(*p - path);
}

/* The name of node n within its directory d: its path past d's and a slash (d's length is at
 * hand; searching the path for its last slash touched each name once more). */
void child_name(const Table *t, uint32_t d, uint32_t n, const char **p, size_t *len) {
    const char *path;
    size_t plen;
    node_path(t, n, &path, &plen);
    size_t skip = d ? (size_t)(t->dir_name_end[d] - t->dir_name_end[d - 1]) + 1 : 0;
    if (skip > plen || (skip && path[skip - 1] != '/')) {
        base_name(t, n, p, len); /* (not a child of d: never, the table is built so) */
        return;
    }
    *p = path + skip;
    *len = plen - skip;
}

static int compare_names(const char *a, size_t alen, const char *b, size_t blen) {
    int c = memcmp(a, b, alen < blen ? alen : blen);
    return c ? c : (alen > blen) - (alen < blen);
}

/* A child with its base name found once, and the 8 bytes of it after what every name in its
 * directory begins with, big-endian (zeros past its end: a name holds no NUL), so that most
 * comparisons are one of two integers. Sorting by the names alone (a memcmp per comparison over
 * the folder's common prefix, "n01440764_" in ImageNet's) took ~1 s of a 4M-member remount. */
typedef struct {
    uint64_t key;
    const char *name;
    size_t len;
    uint32_t node;
    uint32_t skip; /* the directory's common prefix (the same in each of its children) */
} Named;

static int compare_named(const void *x, const void *y) {
    const Named *a = x, *b = y;
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    size_t skip = (size_t)a->skip + 8; /* equal up to here (a shorter name is padded with NULs) */
    if (a->len <= skip || b->len <= skip)
        return (a->len > b->len) - (a->len < b->len);
    return compare_names(a->name + skip, a->len - skip, b->name + skip, b->len - skip);
}

static uint64_t key_at(const char *name, size_t len, size_t skip) {
    uint64_t key = 0;
    for (size_t i = 0; i < 8; i++)
        key = key << 8 | (skip + i < len ? (uint8_t)name[skip + i] : 0);
    return key;
}

/* The children of directories [first, end) in name order; -1 if out of memory. Without the GIL. */
static int sort_children(Table *t, uint32_t first, uint32_t end) {
    uint32_t most = 0;
    for (uint32_t d = first; d < end; d++)
        if (t->child_start[d + 1] - t->child_start[d] > most)
            most = t->child_start[d + 1] - t->child_start[d];
    if (most < 2)
        return 0;
    Named *named = malloc(most * sizeof(Named));
    if (named == NULL)
        return -1;
    for (uint32_t d = first; d < end; d++) {
        uint32_t lo = t->child_start[d], n = t->child_start[d + 1] - lo;
        if (n < 2)
            continue;
        size_t skip = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (i + 16 < n) { /* the names are far apart in memory: ask for them ahead */
                const char *ahead;
                size_t unused;
                node_path(t, t->children[lo + i + 16], &ahead, &unused);
                __builtin_prefetch(ahead);
            }
            named[i].node = t->children[lo + i];
            child_name(t, d, named[i].node, &named[i].name, &named[i].len);
            size_t same = 0, most_same = skip < named[i].len ? skip : named[i].len;
            if (i == 0)
                most_same = named[i].len;
            while (same < most_same && named[i].name[same] == named[0].name[same])
                same++;
            skip = same;
        }
        if (skip > UINT32_MAX - 8)
            skip = 0; /* (no name is that long: PATH_MAX) */
        for (uint32_t i = 0; i < n; i++) {
            named[i].key = key_at(named[i].name, named[i].len, skip);
            named[i].skip = (uint32_t)skip;
        }
        qsort(named, n, sizeof(Named), compare_named);
        for (uint32_t i = 0; i < n; i++)
            t->own_children[lo + i] = named[i].node;
    }
    free(named);
    return 0;
}

typedef struct {
    Table *t;
    uint32_t first, end;
    int result;
} SortJob;

static void *sort_job(void *arg) {
    SortJob *job = arg;
    job->result = sort_children(job->t, job->first, job->end);
    return NULL;
}

enum { SORT_TWO_THREADS_FROM = 1 << 16 }; /* children: fewer are sorted in a blink on one */

/* Every directory's children in name order, on two threads where there are many (each takes the
 * directories holding about half of them: 0.3 s of a 4M-member first mount, which waits for it);
 * -1 if out of memory. Without the GIL. */
static int sort_all_children(Table *t, uint32_t ndirs) {
    uint32_t total = t->child_start[ndirs], half = 0;
    while (half < ndirs && t->child_start[half] < total / 2)
        half++;
    SortJob second = {t, half, ndirs, 0};
    pthread_t other;
    int two = total >= SORT_TWO_THREADS_FROM && half > 0 && half < ndirs &&
              pthread_create(&other, NULL, sort_job, &second) == 0;
    int result = sort_children(t, 0, two ? half : ndirs);
    if (two) {
        pthread_join(other, NULL);
        if (second.result < 0)
            result = -1;
    }
    return result;
}

/* The node of an inode number, or -1. */
int64_t resolve(const Table *t, fuse_ino_t ino) {
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

/* Node n (a member) has a new inode in the kernel, so no cached pages (see push_member). A
 * rescan starts a new table with no marks: a mark missed only means a READ request later. */
void mark_unread(Table *t, uint32_t n) {
    uint32_t m = n - t->ndirs;
    atomic_fetch_or_explicit(&t->unread[m / 8], (uint8_t)(1u << (m % 8)), memory_order_relaxed);
}

/* Whether node n (a member) was marked unread; it is not any more. */
int take_unread(Table *t, uint32_t n) {
    uint32_t m = n - t->ndirs;
    uint8_t bit = (uint8_t)(1u << (m % 8));
    if (!(atomic_load_explicit(&t->unread[m / 8], memory_order_relaxed) & bit))
        return 0;
    return (atomic_fetch_and_explicit(&t->unread[m / 8], (uint8_t)~bit, memory_order_relaxed) & bit) != 0;
}

/* The child of directory d called name, or -1. */
int64_t find_child(const Table *t, uint32_t d, const char *name) {
    size_t len = strlen(name);
    uint32_t lo = t->child_start[d], hi = t->child_start[d + 1];
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        const char *b;
        size_t blen;
        child_name(t, d, t->children[mid], &b, &blen);
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

void fill_stat(const Table *t, uint32_t n, struct stat *st) {
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

/* The buffer of arrays[name] (flags as PyObject_GetBuffer's), and the object in *obj. */
static int get_buffer(PyObject *arrays, const char *name, int flags, Py_buffer *view, PyObject **obj) {
    *obj = PyDict_GetItemString(arrays, name);
    if (*obj == NULL) {
        PyErr_Format(PyExc_KeyError, "table array %s missing", name);
        return -1;
    }
    return PyObject_GetBuffer(*obj, view, flags);
}

/* The memory of arrays[name] (any length: bytes, or a read-only map of a saved view,
 * view/snapshot.py), the object kept in keep for the table's life. */
static int take_bytes(PyObject *arrays, const char *name, const char **out, Py_ssize_t *len, PyObject *keep) {
    Py_buffer view;
    PyObject *obj;
    if (get_buffer(arrays, name, PyBUF_SIMPLE, &view, &obj) < 0)
        return -1;
    *out = view.buf;
    *len = view.len;
    int rc = PyList_Append(keep, obj);
    PyBuffer_Release(&view);
    return rc;
}

/* Fields: (name, address of the pointer, element size). Each array must hold count elements. */
static int take_array(PyObject *arrays, const char *name, const void **out, Py_ssize_t itemsize,
                      Py_ssize_t count, PyObject *keep) {
    Py_buffer view;
    PyObject *obj;
    if (get_buffer(arrays, name, PyBUF_C_CONTIGUOUS, &view, &obj) < 0)
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

/* The arrays a Table keeps, by the name of its field (and of the key in the arrays dict), with the
 * element size of the field and how many elements it must hold. */
enum { NODES, SORTED, DIRS, DIRS_1 /* ndirs + 1 */, MEMBERS, SHARDS };
#define ARRAY(field, count) {#field, offsetof(Table, field), sizeof(*((Table *)0)->field), count}
static const struct {
    const char *name;
    size_t field;
    Py_ssize_t itemsize;
    int count;
} ARRAYS[] = {
    ARRAY(ino, NODES),         ARRAY(by_ino, SORTED),   ARRAY(by_ino_node, SORTED), ARRAY(dir_name_end, DIRS),
    ARRAY(dir_mode, DIRS),     ARRAY(dir_nlink, DIRS),  ARRAY(dir_mtime_ns, DIRS),  ARRAY(dir_parent, DIRS),
    ARRAY(child_start, DIRS_1), ARRAY(name_end, MEMBERS), ARRAY(size, MEMBERS),     ARRAY(offset, MEMBERS),
    ARRAY(shard, MEMBERS),     ARRAY(mode, MEMBERS),    ARRAY(kind, MEMBERS),       ARRAY(mtime, MEMBERS),
    ARRAY(shard_raw, SHARDS),
};

/* Every index in the arrays points into them (the loop trusts them from then on); a ValueError if not. */
static int check_arrays(const Table *t, const uint32_t *children, uint32_t nchildren, Py_ssize_t dir_names_len,
                        Py_ssize_t names_len) {
    uint64_t nn = (uint64_t)t->ndirs + t->nmembers;
    const char *wrong = NULL;
    if (t->dir_name_end[t->ndirs - 1] > dir_names_len || (t->nmembers && t->name_end[t->nmembers - 1] > names_len))
        wrong = "name ends past the names";
    for (uint32_t i = 0; !wrong && i < nchildren; i++)
        if (children[i] >= nn)
            wrong = "a child is not a node";
    for (uint32_t i = 0; !wrong && i < t->nsorted; i++)
        if (t->by_ino_node[i] >= nn || (i && t->by_ino[i - 1] >= t->by_ino[i]))
            wrong = "by_ino must be strictly ascending and name nodes";
    for (uint32_t i = 0; !wrong && i < t->nmembers; i++)
        if (t->shard[i] >= t->nshards)
            wrong = "a member's shard is out of range";
    if (wrong)
        PyErr_SetString(PyExc_ValueError, wrong);
    return wrong ? -1 : 0;
}

static int table_init(Table *t, PyObject *args, PyObject *kwds) {
    PyObject *arrays, *view, *slots;
    unsigned int ndirs, nmembers, nshards, nsorted, symlink_kind, uid, gid;
    unsigned long long files, total;
    int children_sorted = 0;
    static char *kwlist[] = {"arrays", "view", "slots", "ndirs", "nmembers", "nsorted", "symlink_kind",
                             "uid", "gid", "files", "total_size", "children_sorted", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO!IIIIIIKK|p", kwlist, &PyDict_Type, &arrays, &view,
                                     &PyTuple_Type, &slots, &ndirs, &nmembers, &nsorted, &symlink_kind, &uid,
                                     &gid, &files, &total, &children_sorted))
        return -1;
    if (ndirs == 0) {
        PyErr_SetString(PyExc_ValueError, "a table has at least the root directory");
        return -1;
    }
    nshards = (unsigned int)PyTuple_Size(slots);
    t->keep = PyList_New(0);
    if (t->keep == NULL)
        return -1;
    Py_ssize_t dir_names_len, names_len;
    if (take_bytes(arrays, "dir_names", &t->dir_names, &dir_names_len, t->keep) < 0 ||
        take_bytes(arrays, "names", &t->names, &names_len, t->keep) < 0)
        return -1;
    Py_ssize_t nn = (Py_ssize_t)ndirs + nmembers;
    const Py_ssize_t counts[] = {[NODES] = nn,         [SORTED] = nsorted,    [DIRS] = ndirs,
                                 [DIRS_1] = ndirs + 1, [MEMBERS] = nmembers, [SHARDS] = nshards};
    for (size_t i = 0; i < sizeof ARRAYS / sizeof *ARRAYS; i++)
        if (take_array(arrays, ARRAYS[i].name, (const void **)((char *)t + ARRAYS[i].field), ARRAYS[i].itemsize,
                       counts[ARRAYS[i].count], t->keep) < 0)
            return -1;
    const void *children;
    uint32_t nchildren = t->child_start[ndirs];
    /* Children sorted already (a saved view) are used where they are; else sorted in a copy. */
    if (take_array(arrays, "children", &children, 4, nchildren, children_sorted ? t->keep : NULL) < 0)
        return -1;
    t->ndirs = ndirs;
    t->nmembers = nmembers;
    t->nshards = nshards;
    t->nsorted = nsorted;
    if (check_arrays(t, children, nchildren, dir_names_len, names_len) < 0)
        return -1;
    t->slots = PyMem_Calloc(nshards ? nshards : 1, sizeof(Slot *));
    t->unread = PyMem_Calloc(nmembers / 8 + 1, 1);
    if (t->slots == NULL || t->unread == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (children_sorted) {
        /* Not checked again (that touched every name: 0.25 s at 4M members): the saved view's
         * bytes were checked whole, and a child out of order could only make a lookup miss (a
         * lookup compares whole names), never answer another file. */
        t->children = children;
    } else { /* our own sorted copy: lookups are a binary search by name within the directory */
        t->own_children = PyMem_Malloc((nchildren ? nchildren : 1) * sizeof(uint32_t));
        if (t->own_children == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(t->own_children, children, nchildren * sizeof(uint32_t));
        t->children = t->own_children;
    }
    t->symlink_kind = symlink_kind;
    t->uid = uid;
    t->gid = gid;
    t->files = files;
    t->total_size = total;
    int sorted = 0;
    Py_BEGIN_ALLOW_THREADS
    if (!children_sorted)
        sorted = sort_all_children(t, ndirs);
    Py_END_ALLOW_THREADS
    if (sorted < 0) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint32_t s = 0; s < nshards; s++) {
        PyObject *slot = PyTuple_GetItem(slots, s);
        if (slot == Py_None)
            continue;
        if (!PyObject_TypeCheck(slot, SlotType)) {
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

#ifndef PyBUF_READ /* (not in the limited API's headers before 3.11; its value since 3.3) */
#define PyBUF_READ 0x100
#endif

/* A read-only view of the table's own memory, not a copy (16 MB at 4M members): good only while
 * the caller holds the table. */
static PyObject *table_sorted_children(Table *t, PyObject *unused) {
    return PyMemoryView_FromMemory((char *)t->children,
                                   (Py_ssize_t)t->child_start[t->ndirs] * (Py_ssize_t)sizeof(uint32_t), PyBUF_READ);
}

static void table_dealloc(Table *t) {
    if (t->slots) {
        for (uint32_t s = 0; s < t->nshards; s++)
            Py_XDECREF(t->slots[s]);
        PyMem_Free(t->slots);
    }
    PyMem_Free(t->own_children);
    PyMem_Free((void *)t->unread);
    Py_XDECREF(t->view);
    Py_XDECREF(t->keep);
    free_object((PyObject *)t);
}

static PyMethodDef table_methods[] = {
    {"lookup", (PyCFunction)table_lookup, METH_VARARGS,
     "lookup(parent_ino, name) -> ino or None: the request loop's lookup, for tests"},
    {"sorted_children", (PyCFunction)table_sorted_children, METH_NOARGS,
     "sorted_children() -> memoryview: the children in the order lookups search them (to save a view; valid "
     "while the table lives)"},
    {NULL}};

static PyType_Slot table_slots[] = {
    {Py_tp_doc, "One view of the dataset as the request loop answers from it."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, table_init},
    {Py_tp_dealloc, table_dealloc},
    {Py_tp_methods, table_methods},
    {0, NULL}};

PyTypeObject *TableType;
PyType_Spec TABLE_SPEC = {"shardfs.fuse._lowlevel.Table", sizeof(Table), 0, Py_TPFLAGS_DEFAULT, table_slots};
