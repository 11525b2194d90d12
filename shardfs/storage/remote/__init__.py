"""Shards in object storage (S3 and S3-compatible stores) and on HTTP(S) servers, through fsspec.

A remote shard is named by its URL and identified by its size and a tag: the ETag (S3, and
HTTP servers that send one), else the Last-Modified date. Every read is a conditional
ranged GET (S3 ``IfMatch``, HTTP ``If-Match`` / ``If-Unmodified-Since``) whose response is
checked again (ETag, Content-Range, length), so an object overwritten after its index was
built answers a permanent error, never other bytes at the old offsets.

Transient failures (5xx, 429, connection resets, timeouts, short bodies) are retried with
exponential backoff, each retry logged; permanent ones (403, 404, 412, 416) are not.

fsspec, s3fs and aiohttp are imported on first use: a mount of local shards never needs them.
Storage options (``--option KEY=VALUE``) go to the fsspec filesystem as they are; values of
keys that look like credentials never appear in logs, status or error messages (``shardfs.redact``).
"""

from shardfs.redact import RedactingFilter, redact, redact_options  # noqa: F401
from shardfs.storage.remote.client import (OPTIONS_ENV, configure, counters, info, options_from_env,  # noqa: F401
                                           parse_option, read, read_whole)
from shardfs.storage.remote.errors import ObjectInfo, RemoteError  # noqa: F401
from shardfs.storage.remote.listing import known_info, may_exist  # noqa: F401
from shardfs.storage.remote.shard import RemoteShard  # noqa: F401
