/* Names as every format's index keeps them, shared by the compiled scanners (_tarscan.c,
 * _zipdir.c): the columns of a member's row, the normal form of a name (index/names.normalise,
 * where that is a slice of it), its path hash (XXH64) and its parent folder's, and the growable
 * buffers they are emitted into. Static functions: each module has its own copy. */
#ifndef SHARDFS_NAMES_H
#define SHARDFS_NAMES_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* per member: name end, where its normal form starts and ends in it (see normal_span), kind,
 * data offset, size, mode, mtime, link end, kept data end, the normal form's path hash, where its
 * parent folder ends in the name (the normal form's last "/"; NOT_NORMAL where it has none: the
 * root) and the parent's path hash (of "" for the root; 0 where the name is not normal) */
enum { F_NAME_END, F_NORM_START, F_NORM_END, F_KIND, F_OFFSET, F_SIZE, F_MODE, F_MTIME, F_LINK_END, F_SMALL_END,
       F_HASH, F_PARENT_END, F_PARENT_HASH, NFIELDS };
enum { NOT_NORMAL = -1, ROOT = -2 };
#define MAX_NAME 255 /* names.py */
#define MAX_PATH 4095
enum { KIND_FILE = 0, KIND_DIR = 1, KIND_SYMLINK = 2, KIND_HARDLINK = 3 }; /* formats.base.Kind */
typedef struct {
    char *data;
    size_t len, cap;
} Buf;

static int buf_add(Buf *b, const void *src, size_t n) {
    if (n == 0) /* (src may be NULL then, and so may b->data: memcpy wants them valid even for 0) */
        return 0;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + n)
            cap *= 2;
        char *grown = realloc(b->data, cap);
        if (grown == NULL)
            return -1;
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

/* index/names.path_hash: XXH64 (seed 0) of the name, as the xxhash package computes it (tested
 * against it). Computed here for each normal name, as the scan has it at hand: a few multiplies
 * per 8 bytes, where the BLAKE2b it replaced spent a twelve-round compression on every name (a
 * fifth of a 4M-member build's CPU). */
static const uint64_t P1 = 0x9E3779B185EBCA87ULL, P2 = 0xC2B2AE3D27D4EB4FULL, P3 = 0x165667B19E3779F9ULL,
                      P4 = 0x85EBCA77C2B2AE63ULL, P5 = 0x27D4EB2F165667C5ULL;

static inline uint64_t rotl(uint64_t x, int n) { return (x << n) | (x >> (64 - n)); }

static inline uint64_t le64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t le32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline uint64_t xxh_round(uint64_t acc, uint64_t lane) { return rotl(acc + lane * P2, 31) * P1; }

static inline uint64_t xxh_merge(uint64_t h, uint64_t acc) { return (h ^ xxh_round(0, acc)) * P1 + P4; }

static uint64_t path_hash(const unsigned char *data, size_t len) {
    const unsigned char *p = data, *end = data + len;
    uint64_t h;
    if (len >= 32) {
        uint64_t v1 = P1 + P2, v2 = P2, v3 = 0, v4 = -P1;
        for (; p + 32 <= end; p += 32) {
            v1 = xxh_round(v1, le64(p));
            v2 = xxh_round(v2, le64(p + 8));
            v3 = xxh_round(v3, le64(p + 16));
            v4 = xxh_round(v4, le64(p + 24));
        }
        h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
        h = xxh_merge(xxh_merge(xxh_merge(xxh_merge(h, v1), v2), v3), v4);
    } else
        h = P5;
    h += (uint64_t)len;
    for (; p + 8 <= end; p += 8)
        h = rotl(h ^ xxh_round(0, le64(p)), 27) * P1 + P4;
    if (p + 4 <= end) {
        h = rotl(h ^ (uint64_t)le32(p) * P1, 23) * P2 + P3;
        p += 4;
    }
    for (; p < end; p++)
        h = rotl(h ^ *p * P5, 11) * P1;
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    return h ^ (h >> 32);
}

/* Where a name's normal form (names.normalise) lies in it, when that is a slice: after leading
 * "./" and before one trailing "/", with no empty, "." or ".." component, none longer than
 * MAX_NAME. *start is NOT_NORMAL for any other name (Python normalises it), ROOT for one of dots
 * and slashes alone ("./": replay.py leaves such a folder out). */
static void normal_span(const unsigned char *name, size_t len, int64_t *start, int64_t *end) {
    size_t at = 0, stop = len, dots = 0;
    while (dots < len && (name[dots] == '.' || name[dots] == '/'))
        dots++;
    *start = len && dots == len ? ROOT : NOT_NORMAL; /* "./", "/", "..": the root, for a folder */
    *end = 0;
    if (*start == ROOT)
        return;
    while (at + 2 <= len && name[at] == '.' && name[at + 1] == '/')
        at += 2;
    if (stop > at && name[stop - 1] == '/')
        stop--;
    if (at == stop || stop - at > MAX_PATH)
        return;
    size_t part = at;
    for (size_t i = at; i <= stop; i++) {
        if (i < stop && name[i] != '/')
            continue;
        size_t n = i - part;
        if (n == 0 || n > MAX_NAME || (n == 1 && name[part] == '.') ||
            (n == 2 && name[part] == '.' && name[part + 1] == '.'))
            return;
        part = i + 1;
    }
    *start = (int64_t)at;
    *end = (int64_t)stop;
}

/* The parents parse has seen, to hash each folder once and emit the folders above it once. */
enum { SEEN_SLOTS = 1024 };
typedef struct {
    size_t at, len; /* in names */
    uint64_t hash;
    int used;
} Seen;
typedef struct {
    /* the previous member's parent (in names): members of one folder often come together */
    size_t prev_at, prev_len;
    uint64_t prev_hash;
    int have_prev;
    /* parents seen in this call (direct-mapped): one folder's members apart from each other
     * (a shuffled shard of many classes) hash it once; its folders above were emitted then */
    Seen seen[SEEN_SLOTS];
} Parents;

static uint32_t fnv(const unsigned char *data, size_t len) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ data[i]) * 16777619u;
    return h;
}

/* The parent folder of the normal name at norm (in names, norm_start into the member's name): its
 * path hash, and where it ends in row[F_PARENT_END]; the folders above it that the previous parent
 * did not have go to above. -1 if out of memory. */
static int parent_of(Parents *p, const char *names, Buf *above, const unsigned char *norm, size_t norm_len,
                     int64_t norm_start, int64_t row[NFIELDS], uint64_t *parent_hash) {
    size_t parent_len = 0;
    for (size_t i = norm_len; i > 0; i--)
        if (norm[i - 1] == '/') {
            parent_len = i - 1;
            row[F_PARENT_END] = norm_start + (int64_t)parent_len;
            break;
        }
    size_t parent_at = (size_t)((const char *)norm - names);
    Seen *slot = NULL;
    if (p->have_prev && parent_len == p->prev_len && memcmp(names + p->prev_at, norm, parent_len) == 0)
        *parent_hash = p->prev_hash;
    else if ((slot = &p->seen[fnv(norm, parent_len) % SEEN_SLOTS])->used && slot->len == parent_len &&
             memcmp(names + slot->at, norm, parent_len) == 0)
        *parent_hash = slot->hash;
    else {
        *parent_hash = path_hash(norm, parent_len);
        *slot = (Seen){parent_at, parent_len, *parent_hash, 1};
        /* the folders above it, but those the previous parent had too (or was) */
        const char *prev = names + p->prev_at;
        int shared = p->have_prev;
        for (size_t i = 0; i < parent_len; i++) {
            if (norm[i] != '/')
                continue;
            shared = shared && i <= p->prev_len && (i == p->prev_len || prev[i] == '/') && memcmp(prev, norm, i) == 0;
            if (shared)
                continue;
            uint64_t folder = path_hash(norm, i);
            if (buf_add(above, &folder, sizeof folder))
                return -1;
        }
    }
    p->prev_at = parent_at;
    p->prev_len = parent_len;
    p->prev_hash = *parent_hash;
    p->have_prev = 1;
    return 0;
}

/* The normal-form fields of a member's row (F_NORM_START, F_NORM_END, F_HASH, F_PARENT_END,
 * F_PARENT_HASH) for its name (in names): a name with a NUL byte is not normal (replay.py refuses
 * it); a name that is not normal has hash 0 and no parent. -1 if out of memory. */
static int fill_name_fields(Parents *p, const char *names, Buf *above, const unsigned char *name, size_t name_len,
                            int64_t row[NFIELDS]) {
    normal_span(name, name_len, &row[F_NORM_START], &row[F_NORM_END]);
    if (memchr(name, 0, name_len) != NULL)
        row[F_NORM_START] = NOT_NORMAL, row[F_NORM_END] = 0;
    row[F_PARENT_END] = NOT_NORMAL;
    uint64_t hash = 0, parent_hash = 0;
    if (row[F_NORM_START] >= 0) {
        const unsigned char *norm = name + row[F_NORM_START];
        size_t norm_len = (size_t)(row[F_NORM_END] - row[F_NORM_START]);
        hash = path_hash(norm, norm_len);
        if (parent_of(p, names, above, norm, norm_len, row[F_NORM_START], row, &parent_hash) < 0)
            return -1;
    }
    memcpy(&row[F_HASH], &hash, sizeof hash);
    memcpy(&row[F_PARENT_HASH], &parent_hash, sizeof parent_hash);
    return 0;
}

#endif
