/* libFuzzer target for the zip directory's C (shardfs/formats/_zipdir.c), built by run.sh with
 * clang's ASan and UBSan: the input is a central directory (its first two bytes: how many entries
 * the end record claims), walked as zipdir.read_entries walks it, its names' normal forms filled
 * as zip.py fills them, and each name compared with itself through same_bytes' bounds. Beyond "no
 * crash": entries start in order within the directory, the names handed back are exactly the
 * entries' names back to back, and every normal form (and its parent) lies within its name. (The
 * Python side, and its agreement with zipfile and unzip, is the atheris target zip_index's.) */
#include "../../shardfs/formats/_zipdir.c"

#include <assert.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2)
        return 0;
    size_t count = data[0] | (size_t)data[1] << 8;
    const unsigned char *cd = data + 2;
    size_t len = size - 2;
    if (count > len / CENTRAL_SIZE) /* walk() refuses such a count before it walks */
        return 0;
    size_t room = count ? count : 1, cut_at = 0;
    int64_t *starts = malloc(room * sizeof *starts), *ends = malloc(room * sizeof *ends);
    int64_t *rows = calloc(room, sizeof(int64_t[NFIELDS]));
    Buf names = {0}, above = {0};
    assert(starts && ends && rows);
    if (walk_entries(cd, len, count, starts, ends, &names, &cut_at) == 0) {
        const char *blob = names.data ? names.data : ""; /* (no room taken while every name is empty) */
        size_t total = 0;
        for (size_t i = 0; i < count; i++) {
            size_t n = le16(cd + starts[i] + NAME_LEN_AT);
            assert(starts[i] >= 0 && (size_t)starts[i] + CENTRAL_SIZE + n <= len);
            assert(i == 0 || starts[i] > starts[i - 1]);
            assert(memcmp(blob + total, cd + starts[i] + CENTRAL_SIZE, n) == 0);
            total += n;
            assert(ends[i] == (int64_t)total);
            rows[i * NFIELDS + F_NAME_END] = ends[i];
        }
        assert(total == names.len);
        if (fill_normal_forms((const unsigned char *)blob, names.len, rows, count, &above) == 0)
            for (size_t i = 0; i < count; i++) {
                const int64_t *row = rows + i * NFIELDS;
                int64_t name_len = ends[i] - (i ? ends[i - 1] : 0);
                if (row[F_NORM_START] >= 0) {
                    assert(row[F_NORM_START] <= row[F_NORM_END] && row[F_NORM_END] <= name_len);
                    assert(row[F_PARENT_END] == NOT_NORMAL ||
                           (row[F_PARENT_END] >= row[F_NORM_START] && row[F_PARENT_END] < row[F_NORM_END]));
                } else
                    assert(row[F_NORM_START] == NOT_NORMAL || row[F_NORM_START] == ROOT);
            }
        assert(above.len % 8 == 0);
    } else
        assert(cut_at < count);
    free(starts);
    free(ends);
    free(rows);
    free(names.data);
    free(above.data);
    return 0;
}
