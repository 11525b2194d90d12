/* libFuzzer target for the tar scanner's C (shardfs/formats/_tarscan.c), built by run.sh with
 * clang's ASan and UBSan: the input is a shard's bytes, parsed from its start as scan() does with
 * the whole shard in one chunk, then the rows go through plain_members_of as index/plain.py sends
 * them. Beyond "no crash", each parse's output must hold together: it stops on a block boundary
 * within the shard, every row's name, link and kept data end within what was handed back and in
 * order, every member's data within the shard, and every normal form (and its parent) within its
 * name. (The Python side of the same parser, and its agreement with tarfile, is the atheris
 * target's.) */
#include "../../shardfs/formats/_tarscan.c"

#include <assert.h>

/* The last row's field, or 0 before the first. */
static int64_t previous(const int64_t *rows, size_t i, int field) { return i ? rows[(i - 1) * NFIELDS + field] : 0; }

static void check_rows(const Parsed *out, size_t size, size_t stop) {
    assert(stop <= size && stop % BLOCK == 0);
    assert(out->numbers.len % sizeof(int64_t[NFIELDS]) == 0 && out->above.len % 8 == 0);
    const int64_t *rows = (const int64_t *)out->numbers.data;
    size_t n = out->numbers.len / sizeof(int64_t[NFIELDS]);
    for (size_t i = 0; i < n; i++) {
        const int64_t *row = rows + i * NFIELDS;
        int64_t name_at = previous(rows, i, F_NAME_END), name_len = row[F_NAME_END] - name_at;
        assert(name_len >= 0 && row[F_NAME_END] <= (int64_t)out->names.len);
        assert(row[F_LINK_END] >= previous(rows, i, F_LINK_END) && row[F_LINK_END] <= (int64_t)out->links.len);
        assert(row[F_SMALL_END] == -1 || row[F_SMALL_END] <= (int64_t)out->smalls.len);
        assert(row[F_SIZE] >= 0 && row[F_OFFSET] >= 0 && row[F_OFFSET] + row[F_SIZE] <= (int64_t)size);
        if (row[F_NORM_START] >= 0) {
            assert(row[F_NORM_START] <= row[F_NORM_END] && row[F_NORM_END] <= name_len);
            assert(row[F_PARENT_END] == NOT_NORMAL ||
                   (row[F_PARENT_END] >= row[F_NORM_START] && row[F_PARENT_END] < row[F_NORM_END]));
        } else
            assert(row[F_NORM_START] == NOT_NORMAL || row[F_NORM_START] == ROOT);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static Parsed out; /* kept from input to input, as a thread's scratch is from chunk to chunk */
    Buf *bufs[] = PARSED_BUFS(&out);
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        bufs[i]->len = 0;
    size_t stop = 0;
    int failed = 0;
    parse(data, size, 0, 0, (int64_t)size, 64, &out, &stop, &failed);
    if (failed)
        return 0;
    check_rows(&out, size, stop);
    Plain got = {0};
    plain_members_of(out.names.data ? out.names.data : "", out.names.len, (const int64_t *)out.numbers.data,
                     out.numbers.len / sizeof(int64_t[NFIELDS]), (const uint64_t *)out.above.data, out.above.len / 8,
                     &got);
    free(got.keep);
    free(got.blob);
    free(got.name_end);
    free(got.parent);
    free(got.dirs.data);
    return 0;
}
