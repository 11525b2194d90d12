"""An Arrow IPC file or stream's messages (formats/arrowipc.py: its own flatbuffer reader for record
batches, pyarrow for the schema), indexed from the file's bytes as a mount indexes it.

Beyond "no crash" (fuzzlib.check_data_file): damage is refused or recorded, never raised; each
image served is exactly its size and, where pyarrow itself reads the file, the very bytes pyarrow
gives for that row; the index build's own allocations stay within a bound of the file's size.
"""

from __future__ import annotations

import io

from fuzzlib import check_data_file, sample_images


def _pyarrow_rows(path: str, keys: set) -> dict:
    import pyarrow as pa

    with open(path, "rb") as f:
        head = f.read(6)
    with pa.memory_map(path) as source:
        reader = pa.ipc.open_file(source) if head == b"ARROW1" else pa.ipc.open_stream(source)
        table = reader.read_all()
        table.validate(full=True)  # (pyarrow trusts IPC bytes unless asked: unchecked, they crash it)
    column = table.column("image_data")
    return {key: column[key[1]].as_py() for key in keys}


def one_input(data: bytes) -> None:
    check_data_file(data, "train.arrow", _pyarrow_rows)


def seeds() -> list[bytes]:
    import pyarrow as pa

    images = sample_images(10)
    schema = pa.schema([pa.field("image_data", pa.binary()), pa.field("label", pa.uint16())])
    out = []
    for new in (pa.ipc.new_file, pa.ipc.new_stream):
        for per_batch in (1, 4):
            buf = io.BytesIO()
            with new(buf, schema) as writer:
                for i in range(0, len(images), per_batch):
                    part = images[i : i + per_batch]
                    writer.write(pa.record_batch([pa.array(part, pa.binary()),
                                                  pa.array(range(i, i + len(part)), pa.uint16())], schema=schema))
            out.append(buf.getvalue())
    return out
