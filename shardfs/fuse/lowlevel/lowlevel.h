/* Declarations shared by the request loop's files (see requests.c for the whole picture). */
#ifndef SHARDFS_LOWLEVEL_H
#define SHARDFS_LOWLEVEL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "libfuse.h"

#include "../../pybuffer310.h" /* the buffer protocol, also on 3.10 */

#include <dlfcn.h>
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

/* dlopen and its kin moved from libdl into libc in glibc 2.34 under a new symbol version, and so
 * did pthread_create and pthread_join from libpthread; bound to their first one (x86_64:
 * GLIBC_2.2.5, which libc keeps, and setup.py links libdl.so.2 and libpthread.so.0, where older
 * glibc has them), the module loads on glibc 2.17 and newer, not only on 2.34 and newer. */
#if defined(__x86_64__) && defined(__GLIBC__)
__asm__(".symver pthread_create,pthread_create@GLIBC_2.2.5");
__asm__(".symver pthread_join,pthread_join@GLIBC_2.2.5");
__asm__(".symver dlopen,dlopen@GLIBC_2.2.5");
__asm__(".symver dlsym,dlsym@GLIBC_2.2.5");
__asm__(".symver dlvsym,dlvsym@GLIBC_2.2.5");
__asm__(".symver dladdr,dladdr@GLIBC_2.2.5");
__asm__(".symver dlclose,dlclose@GLIBC_2.2.5");
__asm__(".symver dlerror,dlerror@GLIBC_2.2.5");
#endif

#define CHUNK_LOADED 2 /* shardfs.storage.ram.LOADED */

/* One shard's bytes as the loop reads them (slot.c). */
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
    const unsigned char *fmap; /* the file mapped, for mincore (which pages the kernel holds); or NULL */
    size_t fmap_len;
    const uint8_t *fstate; /* chunk states of the disk tier */
    Py_buffer fstatebuf;
    int fpublished;
    uint8_t valid;
    int64_t data_at, header, record_size, block, fchunk, fsize;
    uint32_t magic;
    _Atomic uint64_t disk_hits, disk_bytes;
} Slot;

/* The buffers a Table holds (table.c: the two names and every array). */
#define TABLE_HELD 20

/* One view of the dataset (table.c). Node n: a directory if n < ndirs, else member n - ndirs. */
typedef struct {
    PyObject_HEAD
    _Atomic int users;
    PyObject *view;
    Py_buffer held[TABLE_HELD]; /* the arrays below live in these buffers, held for the table's life */
    int nheld, made;
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
    const uint32_t *children;             /* each directory's sorted by name */
    uint32_t *own_children;               /* children, when sorted here (else NULL: kept as given) */
    const char *names;                    /* member paths, concatenated */
    const int64_t *name_end;              /* [nmembers] */
    const int64_t *size, *offset;         /* [nmembers] */
    const uint32_t *shard;                /* [nmembers] */
    const uint16_t *mode;                 /* [nmembers] */
    const uint8_t *kind;                  /* [nmembers] */
    const double *mtime;                  /* [nmembers] */
    const uint8_t *shard_raw;             /* [nshards]: members are byte ranges of the shard */
    Slot **slots;                         /* [nshards], or NULL entries */
    _Atomic uint8_t *unread;              /* [nmembers / 8]: the kernel made the member's inode (a
                                             lookup, a listing) and has not read it since */
} Table;

enum {
    OP_LOOKUP, OP_GETATTR, OP_OPENDIR, OP_READDIR, OP_READ, OP_IOCTL, OP_STATFS, OP_GETXATTR,
    OP_LISTXATTR, OP_READLINK, OP_FORGET, OP_WRITE_REFUSED, OP_COUNT
};

/* Pushing a member's bytes into the page cache (push_member in requests.c): at most this many. */
#define PUSH_MAX (256 << 10)

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
    Counter disk_cached_reads;     /* disk-tier answers and pushes copied from the tier's page cache */
    Counter pushes, push_failures; /* members put in the page cache with an ioctl's answer */
    int push;
    int readdirplus; /* asked of the kernel at init (0: plain READDIR, for comparisons) */
} Session;

#define COUNT(s, op) atomic_fetch_add_explicit(&(s)->counts[op].n, 1, memory_order_relaxed)

/* Heap types (the limited API has no static ones), made by PyInit__lowlevel from these specs. */
extern PyTypeObject *SlotType, *TableType, *SessionType;
extern PyType_Spec SLOT_SPEC, TABLE_SPEC, SESSION_SPEC;

/* The end of every dealloc: free the object, then drop its reference to its (heap) type. */
static inline void free_object(PyObject *o) {
    PyTypeObject *type = Py_TYPE(o);
    ((freefunc)PyType_GetSlot(type, Py_tp_free))(o);
    Py_DECREF(type);
}
extern const struct fuse_lowlevel_ops LL_OPS;
extern const char *OP_NAMES[OP_COUNT];

/* libfuse.c */
extern PyMethodDef LIBFUSE_METHODS[];
/* slot.c */
int zlib_bind(void);
uint64_t now_ns(void);
const char *slot_pin(Slot *s, int64_t off, size_t len);
char *slot_read_file(Slot *s, int64_t off, size_t len, const char **out, size_t *room, int *cached);
void file_buffer_done(char *p, size_t need);
/* table.c */
void node_path(const Table *t, uint32_t n, const char **p, size_t *len);
void base_name(const Table *t, uint32_t n, const char **p, size_t *len);
void child_name(const Table *t, uint32_t d, uint32_t n, const char **p, size_t *len);
int64_t resolve(const Table *t, fuse_ino_t ino);
void mark_unread(Table *t, uint32_t n);
int take_unread(Table *t, uint32_t n);
int64_t find_child(const Table *t, uint32_t d, const char *name);
void fill_stat(const Table *t, uint32_t n, struct stat *st);
/* requests.c */
Table *table_enter(Session *s);
void table_leave(Table *t);

#endif
