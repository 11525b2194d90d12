"""Hand-made tar bytes, for names and damage that tarfile refuses to write."""


def header(name: bytes, size: int = 0, typeflag: bytes = b"0", linkname: bytes = b"", mode: int = 0o644,
           mtime: int = 1_600_000_000, magic: bytes = b"ustar\x0000") -> bytes:
    h = bytearray(512)
    h[0 : len(name[:100])] = name[:100]
    h[100:108] = b"%07o\0" % mode
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"%011o\0" % mtime
    h[148:156] = b" " * 8
    h[156:157] = typeflag
    h[157 : 157 + len(linkname)] = linkname
    h[257:265] = magic
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def member(name: bytes, data: bytes = b"", **kw) -> bytes:
    pad = (-len(data)) % 512
    return header(name, len(data), **kw) + data + b"\0" * pad


def archive(*members: bytes) -> bytes:
    return b"".join(members) + b"\0" * 1024


def _fix_checksum(h: bytearray) -> bytes:
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def old_sparse_member(name: bytes, runs: list[tuple[int, bytes]], real_size: int) -> bytes:
    """A GNU 'S' member: four runs in its header, the rest in extension blocks of 21."""
    data = b"".join(chunk for _, chunk in runs)
    entries = [b"%011o\0%011o\0" % (offset, len(chunk)) for offset, chunk in runs]
    h = bytearray(header(name, len(data), typeflag=b"S", magic=b"ustar  \0"))
    h[386 : 386 + 24 * len(entries[:4])] = b"".join(entries[:4])
    h[482] = len(entries) > 4
    h[483:495] = b"%011o\0" % real_size
    blocks = [_fix_checksum(h)]
    rest = entries[4:]
    while rest:
        block = bytearray(512)
        block[: 24 * len(rest[:21])] = b"".join(rest[:21])
        rest = rest[21:]
        block[504] = bool(rest)
        blocks.append(bytes(block))
    return b"".join(blocks) + data + b"\0" * (-len(data) % 512)
