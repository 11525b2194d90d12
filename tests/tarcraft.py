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
