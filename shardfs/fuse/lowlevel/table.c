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

/* A member's mtime (seconds) in ns, within what an int64 holds, 0 for NaN: a tar's base-256 mtime
 * may be far beyond it, and a double out of an integer's range is undefined when cast. */
static int64_t mtime_ns_of(double seconds) {
    double ns = seconds * 1e9, most = 9.2e18; /* (INT64_MAX is 9.22e18) */
    return ns != ns ? 0 : ns > most ? (int64_t)most : ns < -most ? -(int64_t)most : (int64_t)ns;
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
        mtime_ns = mtime_ns_of(t->mtime[m]);
    }
    st->st_mtim.tv_sec = mtime_ns / 1000000000;
    st->st_mtim.tv_nsec = mtime_ns % 1000000000;
    if (st->st_mtim.tv_nsec < 0) {
        st->st_mtim.tv_sec -= 1;
        st->st_mtim.tv_nsec += 1000000000;
    }
    st->st_atim = st->st_ctim = st->st_mtim;
}

/* The buffer of arrays[name] (flags as PyObject_GetBuffer's) in *view. */
static int get_buffer(PyObject *arrays, const char *name, int flags, Py_buffer *view) {
    PyObject *obj = PyDict_GetItemString(arrays, name);
    if (obj == NULL) {
        PyErr_Format(PyExc_KeyError, "table array %s missing", name);
        return -1;
    }
    return PyObject_GetBuffer(obj, view, flags);
}

/* arrays[name]'s buffer, held by the table until it is freed (table_dealloc): while a buffer is
 * held, its memory stays where the loop's pointers say (a bytearray cannot be resized, a saved
 * view's map, view/snapshot.py, cannot be closed). NULL with an exception set if there is none. */
static Py_buffer *hold(Table *t, PyObject *arrays, const char *name, int flags) {
    if (t->nheld == TABLE_HELD) { /* (never: TABLE_HELD counts what table_init takes) */
        PyErr_SetString(PyExc_RuntimeError, "a table holds more arrays than TABLE_HELD");
        return NULL;
    }
    Py_buffer *view = &t->held[t->nheld];
    if (get_buffer(arrays, name, flags, view) < 0)
        return NULL;
    t->nheld++;
    return view;
}

/* A ValueError unless view holds count elements of itemsize bytes. */
static int check_length(const Py_buffer *view, const char *name, Py_ssize_t itemsize, Py_ssize_t count) {
    if (view->len == count * itemsize)
        return 0;
    PyErr_Format(PyExc_ValueError, "table array %s: %zd bytes, expected %zd", name, view->len, count * itemsize);
    return -1;
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
_Static_assert(2 + sizeof ARRAYS / sizeof *ARRAYS + 1 == TABLE_HELD, "TABLE_HELD: the names, ARRAYS, children");

/* The names and every array of ARRAYS, held; *dir_names_len and *names_len: the names' lengths. */
static int take_arrays(Table *t, PyObject *arrays, Py_ssize_t *dir_names_len, Py_ssize_t *names_len) {
    Py_buffer *dir_names = hold(t, arrays, "dir_names", PyBUF_SIMPLE);
    Py_buffer *names = dir_names ? hold(t, arrays, "names", PyBUF_SIMPLE) : NULL;
    if (names == NULL)
        return -1;
    t->dir_names = dir_names->buf;
    *dir_names_len = dir_names->len;
    t->names = names->buf;
    *names_len = names->len;
    Py_ssize_t nn = (Py_ssize_t)t->ndirs + t->nmembers;
    const Py_ssize_t counts[] = {[NODES] = nn,           [SORTED] = t->nsorted,  [DIRS] = t->ndirs,
                                 [DIRS_1] = t->ndirs + 1, [MEMBERS] = t->nmembers, [SHARDS] = t->nshards};
    for (size_t i = 0; i < sizeof ARRAYS / sizeof *ARRAYS; i++) {
        Py_buffer *view = hold(t, arrays, ARRAYS[i].name, PyBUF_C_CONTIGUOUS);
        if (view == NULL || check_length(view, ARRAYS[i].name, ARRAYS[i].itemsize, counts[ARRAYS[i].count]) < 0)
            return -1;
        *(const void **)((char *)t + ARRAYS[i].field) = view->buf;
    }
    return 0;
}

/* ends (of n names back to back in len bytes) neither go backwards nor past the names. */
static int ends_in_order(const int64_t *ends, uint32_t n, Py_ssize_t len) {
    int64_t previous = 0;
    for (uint32_t i = 0; i < n; previous = ends[i++])
        if (ends[i] < previous)
            return 0;
    return previous <= len;
}

/* More than any member's size or offset (4 EiB): offset + size, and the kernel's offset added to
 * them, stay far from overflowing an int64. */
#define MEMBER_BYTES_MAX ((int64_t)1 << 62)

/* What is wrong with the arrays' indexes (but the children's: wrong_child), or NULL: every index
 * the loop follows points into the arrays it indexes, and every range it takes (a name, a
 * directory's children) is one. */
static const char *wrong_index(const Table *t, Py_ssize_t dir_names_len, Py_ssize_t names_len) {
    uint64_t nn = (uint64_t)t->ndirs + t->nmembers;
    if (!ends_in_order(t->dir_name_end, t->ndirs, dir_names_len))
        return "directory name ends go backwards or past the names";
    if (!ends_in_order(t->name_end, t->nmembers, names_len))
        return "member name ends go backwards or past the names";
    for (uint32_t d = 0; d < t->ndirs; d++) {
        if (t->child_start[d] > t->child_start[d + 1]) /* (child_start[ndirs]: how many children) */
            return "child_start goes backwards";
        if (t->dir_parent[d] >= t->ndirs)
            return "a directory's parent is not a directory";
    }
    for (uint32_t i = 0; i < t->nsorted; i++)
        if (t->by_ino_node[i] >= nn || (i && t->by_ino[i - 1] >= t->by_ino[i]))
            return "by_ino must be strictly ascending and name nodes";
    for (uint32_t m = 0; m < t->nmembers; m++) {
        if (t->shard[m] >= t->nshards)
            return "a member's shard is out of range";
        /* The loop reads offsets only in shards whose members are byte ranges of them (another
         * format's may be its own, parquet.VIRTUAL); -1 there: not one byte range (fast_bytes). */
        int64_t offset = t->offset[m];
        if (t->size[m] < 0 || t->size[m] > MEMBER_BYTES_MAX ||
            (t->shard_raw[t->shard[m]] && (offset < -1 || offset > MEMBER_BYTES_MAX)))
            return "a member's size or offset is out of range";
    }
    return NULL;
}

/* The same for the children (taken by take_children once child_start is known to be in order). */
static const char *wrong_child(const Table *t) {
    uint64_t nn = (uint64_t)t->ndirs + t->nmembers;
    for (uint32_t i = 0; i < t->child_start[t->ndirs]; i++)
        if (t->children[i] >= nn)
            return "a child is not a node";
    return NULL;
}

/* The children: held where they are when sorted already (a saved view's), else a sorted copy. */
static int take_children(Table *t, PyObject *arrays, int children_sorted) {
    uint32_t nchildren = t->child_start[t->ndirs];
    if (children_sorted) {
        Py_buffer *view = hold(t, arrays, "children", PyBUF_C_CONTIGUOUS);
        if (view == NULL || check_length(view, "children", 4, nchildren) < 0)
            return -1;
        t->children = view->buf;
        return 0;
    }
    Py_buffer view;
    if (get_buffer(arrays, "children", PyBUF_C_CONTIGUOUS, &view) < 0)
        return -1;
    if (check_length(&view, "children", 4, nchildren) < 0) {
        PyBuffer_Release(&view);
        return -1;
    }
    t->own_children = PyMem_Malloc((nchildren ? nchildren : 1) * sizeof(uint32_t));
    if (t->own_children == NULL) {
        PyBuffer_Release(&view);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(t->own_children, view.buf, nchildren * sizeof(uint32_t));
    PyBuffer_Release(&view);
    t->children = t->own_children;
    return 0;
}

/* Each shard's Slot (or None) from the tuple slots, referenced. */
static int take_slots(Table *t, PyObject *slots) {
    t->slots = PyMem_Calloc(t->nshards ? t->nshards : 1, sizeof(Slot *));
    if (t->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint32_t s = 0; s < t->nshards; s++) {
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
    return 0;
}

static int table_init(Table *t, PyObject *args, PyObject *kwds) {
    PyObject *arrays, *view, *slots;
    unsigned int ndirs, nmembers, nsorted, symlink_kind, uid, gid;
    unsigned long long files, total;
    int children_sorted = 0;
    static char *kwlist[] = {"arrays", "view", "slots", "ndirs", "nmembers", "nsorted", "symlink_kind",
                             "uid", "gid", "files", "total_size", "children_sorted", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO!IIIIIIKK|p", kwlist, &PyDict_Type, &arrays, &view,
                                     &PyTuple_Type, &slots, &ndirs, &nmembers, &nsorted, &symlink_kind, &uid,
                                     &gid, &files, &total, &children_sorted))
        return -1;
    if (t->made) { /* the loop may be reading it: its arrays stay as they are */
        PyErr_SetString(PyExc_RuntimeError, "a table is made once");
        return -1;
    }
    t->made = 1;
    if (ndirs == 0 || (uint64_t)ndirs + nmembers > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "a table has the root directory and at most 2**32 - 1 nodes");
        return -1;
    }
    t->ndirs = ndirs;
    t->nmembers = nmembers;
    t->nsorted = nsorted;
    t->nshards = (uint32_t)PyTuple_Size(slots);
    Py_ssize_t dir_names_len, names_len;
    if (take_arrays(t, arrays, &dir_names_len, &names_len) < 0)
        return -1;
    const char *wrong = wrong_index(t, dir_names_len, names_len);
    if (wrong == NULL) { /* (child_start in order: its last is how many children there are) */
        if (take_children(t, arrays, children_sorted) < 0)
            return -1;
        wrong = wrong_child(t);
    }
    if (wrong) {
        PyErr_SetString(PyExc_ValueError, wrong);
        return -1;
    }
    t->unread = PyMem_Calloc(nmembers / 8 + 1, 1);
    if (t->unread == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->symlink_kind = symlink_kind;
    t->uid = uid;
    t->gid = gid;
    t->files = files;
    t->total_size = total;
    /* Children sorted already (a saved view's) are not checked again (that touched every name:
     * 0.25 s at 4M members): the saved view's bytes were checked whole, and a child out of order
     * could only make a lookup miss (a lookup compares whole names), never answer another file. */
    int sorted = 0;
    Py_BEGIN_ALLOW_THREADS
    if (!children_sorted)
        sorted = sort_all_children(t, ndirs);
    Py_END_ALLOW_THREADS
    if (sorted < 0) {
        PyErr_NoMemory();
        return -1;
    }
    if (take_slots(t, slots) < 0)
        return -1;
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
    for (int i = 0; i < t->nheld; i++)
        PyBuffer_Release(&t->held[i]);
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
