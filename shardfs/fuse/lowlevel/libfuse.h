/* The part of libfuse3's low-level API the loop uses, declared here so that the loop builds with
 * a C compiler and Python's headers alone (no libfuse3-dev, no pkg-config), and bound to the node's
 * libfuse3.so.3 when shardfs starts (libfuse.c).
 *
 * Written from libfuse's documented ABI (include/fuse_lowlevel.h, include/fuse_common.h,
 * lib/fuse_versionscript), which libfuse keeps stable within major version 3: structs only grow at
 * their end, and a function whose arguments changed keeps its old form under its old symbol
 * version. What differs between the versions we support (3.3 and newer) is noted where declared;
 * what an older one lacks, the loop does without (shardfs.fuse.lib logs it once).
 */
#ifndef SHARDFS_LIBFUSE_H
#define SHARDFS_LIBFUSE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>

/* major * 100 + minor. 3.3 (RHEL 8) is the oldest that takes a mountpoint /dev/fd/N and has
 * every function below. */
#define LIBFUSE_MIN_VERSION 303
#define FUSE_ROOT_ID 1

typedef uint64_t fuse_ino_t;
typedef struct fuse_req *fuse_req_t;
struct fuse_session;   /* opaque */
struct fuse_file_info; /* passed through only: the loop never opens files (open answers ENOSYS) */

/* The leading fields, the same in every 3.x; the loop only receives pointers to it. (3.17 added
 * 64-bit capable_ext/want_ext further on and converts a changed want itself.) */
struct fuse_conn_info {
    uint32_t proto_major, proto_minor, max_write, max_read, max_readahead;
    uint32_t capable; /* FUSE_CAP_* the kernel offers */
    uint32_t want;    /* FUSE_CAP_* the filesystem takes */
};

#define FUSE_CAP_READDIRPLUS (1u << 13)
#define FUSE_CAP_READDIRPLUS_AUTO (1u << 14)
#define FUSE_CAP_CACHE_SYMLINKS (1u << 23)

struct fuse_entry_param {
    fuse_ino_t ino;
    uint64_t generation;
    struct stat attr;
    double attr_timeout, entry_timeout;
};

struct fuse_forget_data {
    fuse_ino_t ino;
    uint64_t nlookup;
};

struct fuse_args {
    int argc;
    char **argv;
    int allocated;
};

/* One buffer of memory (flags 0). mem_size arrived in 3.18; older versions never read it. */
struct fuse_buf {
    size_t size;
    int flags;
    void *mem;
    int fd;
    off_t pos;
    size_t mem_size;
};

struct fuse_bufvec {
    size_t count, idx, off;
    struct fuse_buf buf[1];
};

/* The thread pool's settings: this struct for fuse_session_loop_mt@FUSE_3.2 (3.2 to 3.11, and
 * still taken by newer versions under that symbol version); an opaque one made by
 * fuse_loop_cfg_create for fuse_session_loop_mt@FUSE_3.12, which alone has max_threads. */
struct fuse_loop_config_v1 {
    int clone_fd;
    unsigned int max_idle_threads;
};
struct fuse_loop_config; /* 3.12 */

typedef void (*fuse_unused_op)(void); /* a slot the loop leaves empty (libfuse's default answer) */

/* Every member up to copy_file_range (3.4), in libfuse's order; libfuse takes the size we pass,
 * so the operations added after it (lseek, tmpfile, statx) stay at libfuse's defaults. 3.3 ends
 * before copy_file_range: it is given the shorter size (libfuse.ops_size; a larger one costs a
 * warning on stderr). There libfuse answers a copy ENOSYS and the kernel falls back to writes,
 * which answer EROFS. */
struct fuse_lowlevel_ops {
    void (*init)(void *userdata, struct fuse_conn_info *conn);
    fuse_unused_op destroy;
    void (*lookup)(fuse_req_t req, fuse_ino_t parent, const char *name);
    void (*forget)(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup);
    void (*getattr)(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
    void (*setattr)(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set, struct fuse_file_info *fi);
    void (*readlink)(fuse_req_t req, fuse_ino_t ino);
    void (*mknod)(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev);
    void (*mkdir)(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode);
    void (*unlink)(fuse_req_t req, fuse_ino_t parent, const char *name);
    void (*rmdir)(fuse_req_t req, fuse_ino_t parent, const char *name);
    void (*symlink)(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name);
    void (*rename)(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent, const char *newname,
                   unsigned int flags);
    void (*link)(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname);
    void (*open)(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
    void (*read)(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi);
    void (*write)(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                  struct fuse_file_info *fi);
    void (*flush)(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
    fuse_unused_op release, fsync;
    void (*opendir)(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
    void (*readdir)(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi);
    fuse_unused_op releasedir, fsyncdir;
    void (*statfs)(fuse_req_t req, fuse_ino_t ino);
    void (*setxattr)(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size, int flags);
    void (*getxattr)(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size);
    void (*listxattr)(fuse_req_t req, fuse_ino_t ino, size_t size);
    void (*removexattr)(fuse_req_t req, fuse_ino_t ino, const char *name);
    fuse_unused_op access;
    void (*create)(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, struct fuse_file_info *fi);
    fuse_unused_op getlk, setlk, bmap;
    /* cmd is an int for filesystems built for FUSE_USE_VERSION < 35: the same 32 bits */
    void (*ioctl)(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void *arg, struct fuse_file_info *fi,
                  unsigned flags, const void *in_buf, size_t in_bufsz, size_t out_bufsz);
    fuse_unused_op poll, write_buf, retrieve_reply;
    void (*forget_multi)(fuse_req_t req, size_t count, struct fuse_forget_data *forgets);
    fuse_unused_op flock;
    void (*fallocate)(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
                      struct fuse_file_info *fi);
    void (*readdirplus)(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi);
    void (*copy_file_range)(fuse_req_t req, fuse_ino_t ino_in, off_t off_in, struct fuse_file_info *fi_in,
                            fuse_ino_t ino_out, off_t off_out, struct fuse_file_info *fi_out, size_t len, int flags);
};

/* libfuse's functions, bound by libfuse_bind (libfuse.c): libfuse.reply_err(req, ENOENT) calls
 * fuse_reply_err. The loop_cfg_* group and session_loop_mt_312 are NULL before 3.12. */
struct libfuse {
    int release;     /* major * 100 + minor, found by libfuse_open (libfuse.c: not fuse_version()) */
    size_t ops_size; /* of the struct fuse_lowlevel_ops this release knows */
    int (*version)(void);
    const char *(*pkgversion)(void);
    struct fuse_session *(*session_new)(struct fuse_args *args, const struct fuse_lowlevel_ops *op, size_t op_size,
                                        void *userdata);
    int (*session_mount)(struct fuse_session *se, const char *mountpoint);
    void (*session_unmount)(struct fuse_session *se);
    void (*session_destroy)(struct fuse_session *se);
    void (*session_exit)(struct fuse_session *se);
    int (*set_signal_handlers)(struct fuse_session *se);
    void (*remove_signal_handlers)(struct fuse_session *se);
    int (*session_loop_mt_32)(struct fuse_session *se, struct fuse_loop_config_v1 *config);
    int (*session_loop_mt_312)(struct fuse_session *se, struct fuse_loop_config *config);
    struct fuse_loop_config *(*loop_cfg_create)(void);
    void (*loop_cfg_destroy)(struct fuse_loop_config *config);
    void (*loop_cfg_set_max_threads)(struct fuse_loop_config *config, unsigned int value);
    void (*loop_cfg_set_idle_threads)(struct fuse_loop_config *config, unsigned int value);
    int (*lowlevel_notify_inval_inode)(struct fuse_session *se, fuse_ino_t ino, off_t off, off_t len);
    int (*lowlevel_notify_store)(struct fuse_session *se, fuse_ino_t ino, off_t offset, struct fuse_bufvec *bufv,
                                 int flags);
    void *(*req_userdata)(fuse_req_t req);
    int (*reply_err)(fuse_req_t req, int err);
    void (*reply_none)(fuse_req_t req);
    int (*reply_entry)(fuse_req_t req, const struct fuse_entry_param *e);
    int (*reply_attr)(fuse_req_t req, const struct stat *attr, double attr_timeout);
    int (*reply_readlink)(fuse_req_t req, const char *link);
    int (*reply_buf)(fuse_req_t req, const char *buf, size_t size);
    int (*reply_statfs)(fuse_req_t req, const struct statvfs *stbuf);
    int (*reply_xattr)(fuse_req_t req, size_t count);
    size_t (*add_direntry)(fuse_req_t req, char *buf, size_t bufsize, const char *name, const struct stat *stbuf,
                           off_t off);
    size_t (*add_direntry_plus)(fuse_req_t req, char *buf, size_t bufsize, const char *name,
                                const struct fuse_entry_param *e, off_t off);
};

extern struct libfuse libfuse;

#endif
