"""A Parquet file's footer, column chunks and page headers (formats/parquet.py, with pyarrow reading
the footer), indexed from the file's bytes as a mount indexes it.

Beyond "no crash" (fuzzlib.check_data_file): damage is refused or recorded, never raised; each
image served (from uncompressed pages as stored, from compressed ones decoded) is exactly its
size and, where pyarrow itself reads the file, the very bytes pyarrow gives for that row; the index
build's own allocations stay within a bound of the file's size.
"""

from __future__ import annotations

import io

from fuzzlib import check_data_file, sample_images


def _pyarrow_rows(path: str, keys: set) -> dict:
    import pyarrow.parquet as pq

    # (ParquetFile, as the scan opens it: read_table's dataset layer crashed on a damaged footer)
    column = pq.ParquetFile(path).read(columns=["image_data"]).column(0)
    return {key: column[key[1]].as_py() for key in keys}


def one_input(data: bytes) -> None:
    check_data_file(data, "train.parquet", _pyarrow_rows)


def seeds() -> list[bytes]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    images = sample_images(12)
    table = pa.table({"image_data": pa.array(images, pa.binary()), "label": pa.array(range(12), pa.int64())})
    out = []
    for options in [dict(compression="none"), dict(compression="snappy"), dict(compression="zstd"),
                    dict(compression="none", use_dictionary=True, data_page_version="2.0"),
                    dict(compression="gzip", row_group_size=5, data_page_size=1024)]:
        buf = io.BytesIO()
        pq.write_table(table, buf, **options)
        out.append(buf.getvalue())
    return out
