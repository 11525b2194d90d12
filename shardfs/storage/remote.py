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
keys that look like credentials never appear in logs, status or error messages (``redact``).
"""

from __future__ import annotations

import asyncio
import email.utils
import errno
import fnmatch
import json
import logging
import os
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from shardfs.errors import UsageError
from shardfs.formats import format_for, suffixes
from shardfs.formats.base import SourceUnavailable
from shardfs.storage.local import Shard, ShardIOError

log = logging.getLogger(__name__)

WINDOW = 8 << 20  # read-ahead of an index scan: one 8 MiB GET covers many tar headers
RETRIES = int(os.environ.get("SHARDFS_REMOTE_RETRIES", "6"))  # attempts per request
BACKOFF = 0.2  # seconds before the first retry; doubles each time (with jitter), capped
BACKOFF_CAP = 5.0
REQUEST_TIMEOUT = 120.0  # one request, body included
INFO_THREADS = 16  # HEAD requests at once when a brace URL names many objects
OPTIONS_ENV = "SHARDFS_STORAGE_OPTIONS"  # how a detaching mount hands options to its daemon (not argv)


# ---- credentials never shown ------------------------------------------------

_SECRET_WORDS = ("key", "secret", "token", "password", "passwd", "credential", "auth", "signature", "session")
_SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
_secrets: set[str] = set()
_URL_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
_QUERY_SECRET = re.compile(r"(?i)([?&][^=&\s]*(?:signature|credential|token|key|secret)[^=&\s]*=)[^&\s]+")


def is_secret(key: str) -> bool:
    return any(word in key.lower() for word in _SECRET_WORDS)


def _remember_secrets(value, key: str = "") -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _remember_secrets(v, str(k) if is_secret(str(k)) else key)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _remember_secrets(v, key)
    elif key and value not in (None, "", True, False) and len(str(value)) >= 4:
        _secrets.add(str(value))


def redact(text: str) -> str:
    """``text`` without credentials: known secret values, user:password@ in URLs, signed-URL queries."""
    for env in _SECRET_ENV:
        value = os.environ.get(env)
        if value and len(value) >= 4:
            _secrets.add(value)
    for secret in sorted(_secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    text = _URL_USERINFO.sub("***@", text)
    return _QUERY_SECRET.sub(r"\1***", text)


def redact_options(options: dict) -> dict:
    return {k: ("***" if is_secret(k) else v) for k, v in options.items()}


class RedactingFilter(logging.Filter):
    """On every log handler: whatever a message says (ours, botocore's, aiohttp's), no credentials."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message or record.args:
            record.msg, record.args = clean, ()
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


# ---- storage options ----------------------------------------------------------

_options: dict = {}


def parse_option(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` from the command line: true/false, numbers and JSON objects are typed."""
    key, sep, value = text.partition("=")
    if not sep or not key:  # (not echoed: it may be a credential)
        raise UsageError("--option: expected KEY=VALUE, such as endpoint_url=http://host:9000")
    if is_secret(key):
        return key, value  # a credential stays a string, even if it looks like a number
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    if re.fullmatch(r"-?\d+", value):
        return key, int(value)
    if value.startswith("{"):
        try:
            return key, json.loads(value)
        except ValueError:
            raise UsageError(f"--option {key}: not valid JSON") from None
    return key, value


def configure(options: dict | None) -> None:
    """Storage options for every remote source of this process (fsspec storage options)."""
    global _options
    _options = dict(options or {})
    _remember_secrets(_options)
    _stores.clear()


def options_from_env() -> dict:
    text = os.environ.pop(OPTIONS_ENV, None)
    return json.loads(text) if text else {}


# ---- object identity and errors -----------------------------------------------


@dataclass(frozen=True)
class ObjectInfo:
    url: str
    size: int
    tag: str  # ETag, or "last-modified:<date>"; "" when the server gives neither
    mtime_ns: int


class RemoteError(OSError):
    """A request failed. ``permanent``: retrying cannot help (403, 404, 412, ...)."""

    def __init__(self, message: str, permanent: bool, status: int | None = None):
        super().__init__(errno.EIO, redact(message))
        self.permanent, self.status = permanent, status

    def __str__(self) -> str:
        return self.strerror


_PERMANENT_STATUS = {400, 401, 403, 404, 405, 410, 412, 416}


def _status_error(what: str, status: int, reason: str = "") -> RemoteError:
    why = {404: "not found", 403: "access denied", 412: "changed since its index was built (precondition failed)",
           416: "range not satisfiable (object shrank?)"}.get(status, reason or "error")
    return RemoteError(f"{what}: HTTP {status} {why}", permanent=status in _PERMANENT_STATUS, status=status)


def _mtime_ns(value) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        try:
            value = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return 0
    return int(value.timestamp() * 1e9)


# ---- backends -------------------------------------------------------------------


class _S3:
    """S3 and compatibles (MinIO, Ceph RGW, AIStore) through s3fs's aiobotocore client."""

    def __init__(self, options: dict):
        import s3fs  # lazy: only remote mounts need it

        for noisy in ("botocore", "aiobotocore", "s3fs"):  # "Found credentials in ..." at every start
            logging.getLogger(noisy).setLevel(logging.WARNING)
        options = dict(options)
        config = dict(options.pop("config_kwargs", None) or {})
        config.setdefault("retries", {"total_max_attempts": 1})  # we retry, and log it
        self.fs = s3fs.S3FileSystem(config_kwargs=config, skip_instance_cache=True, **options)
        self.loop = self.fs.loop

    @staticmethod
    def _split(url: str) -> tuple[str, str]:
        bucket, _, key = url[len("s3://"):].partition("/")
        return bucket, key

    async def _client(self, bucket: str):
        await self.fs.set_session()
        return await self.fs.get_s3(bucket)

    @staticmethod
    def _translate(what: str, exc: Exception) -> RemoteError:
        from botocore.exceptions import ClientError, NoCredentialsError, ParamValidationError

        if isinstance(exc, (NoCredentialsError, ParamValidationError)):
            return RemoteError(f"{what}: {exc}", permanent=True)
        if isinstance(exc, ClientError):
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "NoSuchBucket", "AccessDenied", "PreconditionFailed", "InvalidAccessKeyId",
                        "SignatureDoesNotMatch", "InvalidRange"):
                status = status or 400
            err = _status_error(what, status, "" if code.isdigit() else code)
            if code in ("SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable"):
                err.permanent = False
            return err
        return RemoteError(f"{what}: {type(exc).__name__}: {exc}", permanent=False)

    def _info_of(self, bucket: str, entry: dict) -> ObjectInfo:
        return ObjectInfo(f"s3://{bucket}/{entry['Key']}", int(entry.get("Size", entry.get("ContentLength", 0))),
                          entry.get("ETag", ""), _mtime_ns(entry.get("LastModified")))

    async def info(self, url: str) -> ObjectInfo:
        bucket, key = self._split(url)
        s3 = await self._client(bucket)
        try:
            head = await s3.head_object(Bucket=bucket, Key=key)
        except Exception as exc:
            raise self._translate(f"HEAD {url}", exc) from None
        return self._info_of(bucket, {"Key": key, **head})

    async def listing(self, url: str) -> tuple[list[ObjectInfo], list[str]]:
        """Shards directly under a prefix (not recursive, like a local directory), and every URL there."""
        bucket, prefix = self._split(url)
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        s3 = await self._client(bucket)
        found, token = [], None
        try:
            while True:
                kw = {"Bucket": bucket, "Prefix": prefix, "Delimiter": "/", **({"ContinuationToken": token} if token else {})}
                page = await s3.list_objects_v2(**kw)
                found += [self._info_of(bucket, e) for e in page.get("Contents", [])]
                if not page.get("IsTruncated"):
                    return [o for o in found if format_for(o.url) is not None], [o.url for o in found]
                token = page["NextContinuationToken"]
        except Exception as exc:
            raise self._translate(f"LIST {url}", exc) from None

    async def get(self, url: str, start: int, length: int | None, tag: str | None, out=None):
        bucket, key = self._split(url)
        what = f"GET {url}" + (f" bytes {start}-{start + length - 1}" if length is not None else "")
        s3 = await self._client(bucket)
        kw = {"Bucket": bucket, "Key": key}
        if length is not None:
            kw["Range"] = f"bytes={start}-{start + length - 1}"
        if tag:
            kw["IfMatch"] = tag
        try:
            resp = await s3.get_object(**kw)
            if tag and resp.get("ETag") and resp["ETag"] != tag:
                raise RemoteError(f"{what}: ETag {resp['ETag']} is not {tag} (object changed)", permanent=True)
            async with resp["Body"] as body:
                return await _body(body.read, out)
        except RemoteError:
            raise
        except Exception as exc:
            raise self._translate(what, exc) from None


class _HTTP:
    """HTTP(S) servers with Range support, through fsspec's HTTPFileSystem (aiohttp)."""

    def __init__(self, options: dict):
        from fsspec.implementations.http import HTTPFileSystem

        self.fs = HTTPFileSystem(skip_instance_cache=True, **options)
        self.loop = self.fs.loop

    def _translate(self, what: str, exc: Exception) -> RemoteError:
        if isinstance(exc, RemoteError):
            return exc
        return RemoteError(f"{what}: {type(exc).__name__}: {exc}", permanent=False)

    async def _request(self, method: str, url: str, headers: dict):
        import aiohttp

        session = await self.fs.set_session()
        kw = dict(self.fs.kwargs)
        headers = {**kw.pop("headers", {}), **headers, "Accept-Encoding": "identity"}
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT, sock_read=30)
        return await session.request(method, url, headers=headers, timeout=timeout, **kw)

    async def info(self, url: str) -> ObjectInfo:
        try:
            async with await self._request("HEAD", url, {}) as r:
                if r.status not in (405, 501):
                    return self._info_of(url, "HEAD", r)
            # A server that does not do HEAD: the first byte, and the size from Content-Range.
            async with await self._request("GET", url, {"Range": "bytes=0-0"}) as r:
                return self._info_of(url, "GET", r)
        except Exception as exc:
            raise self._translate(f"HEAD {url}", exc) from None

    @staticmethod
    def _info_of(url: str, method: str, r) -> ObjectInfo:
        if r.status >= 300:
            raise _status_error(f"{method} {url}", r.status, r.reason or "")
        got_range = r.headers.get("Content-Range", "")
        if r.status == 206 and re.fullmatch(r"bytes \d+-\d+/\d+", got_range):
            size = int(got_range.rsplit("/", 1)[1])
        elif method == "HEAD" and "Content-Length" in r.headers:
            size = int(r.headers["Content-Length"])
        else:
            raise RemoteError(f"{method} {url}: the server does not say the size", permanent=True)
        etag, modified = r.headers.get("ETag", ""), r.headers.get("Last-Modified", "")
        tag = etag if etag and not etag.startswith("W/") else (f"last-modified:{modified}" if modified else "")
        return ObjectInfo(url, size, tag, _mtime_ns(modified or None))

    async def listing(self, url: str) -> tuple[list[ObjectInfo], list[str]]:
        """Shards linked from a directory page (nginx autoindex and the like), and every link."""
        try:
            links = await self.fs._ls(url, detail=False)
        except Exception as exc:
            raise self._translate(f"LIST {url}", exc) from None
        shards = [link for link in links if format_for(link) is not None]
        return list(await asyncio.gather(*(self.info(link) for link in shards))), links

    async def get(self, url: str, start: int, length: int | None, tag: str | None, out=None):
        what = f"GET {url}" + (f" bytes {start}-{start + length - 1}" if length is not None else "")
        headers = {}
        if length is not None:
            headers["Range"] = f"bytes={start}-{start + length - 1}"
        if tag and tag.startswith("last-modified:"):
            headers["If-Unmodified-Since"] = tag.split(":", 1)[1]
        elif tag:
            headers["If-Match"] = tag
        try:
            async with await self._request("GET", url, headers) as r:
                if r.status >= 300:
                    raise _status_error(what, r.status, r.reason or "")
                got_tag = r.headers.get("ETag")
                if tag and got_tag and not tag.startswith("last-modified:") and got_tag != tag:
                    raise RemoteError(f"{what}: ETag {got_tag} is not {tag} (object changed)", permanent=True)
                if length is not None and r.status == 206:
                    got_range = r.headers.get("Content-Range", "")
                    if not got_range.startswith(f"bytes {start}-{start + length - 1}/"):
                        raise RemoteError(f"{what}: the server sent {got_range or 'no Content-Range'}", permanent=True)
                elif length is not None and not (start == 0 and r.content_length == length):
                    raise RemoteError(f"{what}: the server ignores Range requests (status {r.status})",
                                      permanent=True)
                return await _body(r.content.read, out)
        except Exception as exc:
            raise self._translate(what, exc) from None


async def _body(read, out):
    """The response body (``read(n)`` gives up to n bytes, b"" at its end): as bytes, or written
    into the memoryview ``out`` (one copy less; returns how many bytes came)."""
    if out is None:
        return await read(-1)
    pos = 0
    while True:
        chunk = await read(min(1 << 20, len(out) - pos) if pos < len(out) else 1)
        if not chunk:
            return pos
        if pos + len(chunk) > len(out):
            raise RemoteError(f"body longer than the {len(out)} bytes asked for", permanent=False)
        out[pos : pos + len(chunk)] = chunk
        pos += len(chunk)


_stores: dict[tuple[str, int], object] = {}
_stores_lock = threading.Lock()


def _store(url: str):
    """One fsspec filesystem per scheme and process (a forked index worker makes its own)."""
    kind = "s3" if url.startswith("s3://") else "http"
    key = (kind, os.getpid())
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            try:
                store = _stores[key] = (_S3 if kind == "s3" else _HTTP)(_options)
            except ImportError as exc:
                raise UsageError(f"{kind} sources need the remote extra ({exc.name} is missing): "
                                 "pip install 'shardfs[remote]'") from None
            except (TypeError, ValueError) as exc:
                raise UsageError(f"storage options {redact_options(_options)}: {redact(str(exc))}") from None
    return store


# ---- requests, with retries ---------------------------------------------------------

_counts = {"requests": 0, "retries": 0, "failed": 0, "bytes": 0}
_counts_lock = threading.Lock()


def _count(key: str, n: int = 1) -> None:
    with _counts_lock:
        _counts[key] += n


def counters() -> dict:
    with _counts_lock:
        return dict(_counts)


def _call(what: str, make, *args, optional: bool = False):
    """Run ``make(*args)`` (a coroutine function of a backend) on fsspec's loop; retry transient errors.
    ``optional``: the object may well not exist (a 404 is not counted as a failure)."""
    import fsspec.asyn

    store = make.__self__
    for attempt in range(1, RETRIES + 1):
        _count("requests")
        try:
            return fsspec.asyn.sync(store.loop, asyncio.wait_for, make(*args), REQUEST_TIMEOUT)
        except RemoteError as exc:
            error = exc
        except (asyncio.TimeoutError, TimeoutError) as exc:
            error = RemoteError(f"{what}: timed out after {REQUEST_TIMEOUT:.0f} s", permanent=False)
            error.__cause__ = exc
        except Exception as exc:  # connecting, signing, ...: whatever it is, retried and logged
            error = RemoteError(f"{what}: {type(exc).__name__}: {exc}", permanent=False)
        if error.permanent or attempt == RETRIES:
            if not (optional and error.status in (403, 404, 410)):
                _count("failed")
            if not error.permanent:
                error.strerror = f"{error.strerror} (gave up after {RETRIES} attempts)"
            raise error
        delay = min(BACKOFF * 2 ** (attempt - 1), BACKOFF_CAP) * random.uniform(0.5, 1.0)
        _count("retries")
        log.warning("%s; retry %d of %d in %.2f s", error, attempt, RETRIES - 1, delay)
        time.sleep(delay)
    raise AssertionError("unreachable")


def info(url: str) -> ObjectInfo:
    store = _store(url)
    return _call(f"HEAD {url}", store.info, url)


def read(url: str, offset: int, length: int, tag: str | None, out: memoryview | None = None):
    """Exactly ``length`` bytes at ``offset`` of the object as it was when tagged ``tag``:
    returned, or written into ``out`` (a memoryview of that length)."""
    store = _store(url)
    what = f"GET {url} bytes {offset}-{offset + length - 1}"
    for attempt in range(1, RETRIES + 1):
        data = _call(what, store.get, url, offset, length, tag, out)
        got = data if out is not None else len(data)
        if got == length:
            _count("bytes", length)
            return data
        # A cut connection the client did not notice: never hand on a short body.
        if attempt == RETRIES:
            raise RemoteError(f"{what}: short body ({got} bytes) after {RETRIES} attempts", permanent=False)
        _count("retries")
        log.warning("%s: short body (%d of %d bytes); retrying", what, got, length)
    raise AssertionError("unreachable")


def read_whole(url: str) -> bytes | None:
    """The whole object, or None if there is none (an optional file such as an index)."""
    store = _store(url)
    try:
        return _call(f"GET {url}", store.get, url, 0, None, None, optional=True)
    except RemoteError as exc:
        if exc.status in (403, 404, 410):
            return None
        raise


# ---- sources: URLs, brace ranges, prefixes --------------------------------------------


def expand_braces(url: str) -> list[str]:
    """WebDataset's brace notation (``train-{000000..000146}.tar``, ``{a,b}``), expanded by the
    library WebDataset itself uses, so a URL names the same shards for both."""
    from braceexpand import braceexpand

    urls = list(braceexpand(url))
    if any("{" in u or "}" in u for u in urls):  # braceexpand leaves what it cannot expand
        raise UsageError(f"{redact(url)}: cannot expand its braces (expected {{000..146}} or {{a,b}})")
    return urls


_known: dict[str, ObjectInfo] = {}  # what the last listing said of each object
_listed: dict[str, set[str]] = {}  # folder URL -> every URL in it, as listed


def may_exist(url: str) -> bool:
    """False if ``url``'s folder was listed and it was not there: spares a GET that would 404."""
    folder = url[: url.rfind("/") + 1]
    return folder not in _listed or url in _listed[folder]


def _list(folder: str) -> list[ObjectInfo]:
    shards, everything = _call(f"LIST {folder}", _store(folder).listing, folder)
    _listed[folder if folder.endswith("/") else folder + "/"] = set(everything)
    return shards


def known_info(url: str) -> ObjectInfo:
    """The object's size and tag as listed at mount (one HEAD if it was not listed)."""
    found = _known.get(url)
    return found if found is not None else info(url)


def find_objects(src: str) -> list[ObjectInfo]:
    """Shard objects named by one remote SRC: a prefix (``s3://b/p/``), a glob, a brace pattern, one URL."""
    shown = redact(src)
    try:
        if "{" in src:
            urls = expand_braces(src)
            bad = [u for u in urls if format_for(u) is None]
            if bad:
                raise UsageError(f"{shown}: {redact(bad[0])} is not a shard (expected {', '.join(suffixes())})")
            with ThreadPoolExecutor(min(INFO_THREADS, len(urls))) as pool:
                found = list(pool.map(info, urls))
        elif src.endswith("/") or (src.startswith("s3://") and format_for(src) is None
                                   and not any(c in src for c in "*?[")):  # s3://bucket/prefix
            found = _list(src)
            if not found:
                raise UsageError(f"{shown}: no shard found under this prefix (looked for {', '.join(suffixes())})")
        elif any(c in src for c in "*?["):
            folder = src[: src.rfind("/", 0, min(i for i in (src.find(c) for c in "*?[") if i >= 0)) + 1]
            found = [o for o in _list(folder) if fnmatch.fnmatchcase(o.url, src)]
            if not found:
                raise UsageError(f"{shown}: the pattern matches no shard ({', '.join(suffixes())})")
        else:
            if format_for(src) is None:
                raise UsageError(f"{shown}: not a shard (expected one of {', '.join(suffixes())})")
            found = [info(src)]
    except RemoteError as exc:
        raise UsageError(str(exc)) from None
    for obj in found:
        _known[obj.url] = obj
    return found


# ---- remote shards ----------------------------------------------------------------------


class RemoteSource:
    """A remote object as a ByteSource (for index scans and lz4 tables): 8 MiB read-ahead."""

    window = WINDOW

    def __init__(self, obj: ObjectInfo):
        self.obj, self.size = obj, obj.size

    def pread(self, offset: int, length: int) -> bytes:
        length = min(length, self.size - offset)
        try:
            return read(self.obj.url, offset, length, self.obj.tag) if length > 0 else b""
        except RemoteError as exc:  # not an OSError: a scan must stop here, not record damage
            raise SourceUnavailable(exc, exc.permanent) from None


class RemoteShard(Shard):
    """A shard in object storage or on an HTTP server: ranged GETs instead of preads."""

    remote = True

    def __init__(self, url: str, size: int, mtime_ns: int, tag: str):
        super().__init__(url, size, mtime_ns)
        self.tag = tag
        self._errors_logged = 0

    def _source(self) -> RemoteSource:
        return RemoteSource(ObjectInfo(self.path, self.size, self.tag, self.mtime_ns))

    def changed_on_disk(self) -> bool:
        try:
            now = info(self.path)
        except RemoteError:
            return True
        return (now.size, now.tag) != (self.size, self.tag)

    def fd(self) -> int:
        raise ShardIOError(f"{self.path}: a remote shard has no file descriptor")

    def pread(self, offset: int, length: int, out: memoryview | None = None) -> bytes:
        if self.broken:
            raise ShardIOError(self.broken)
        try:
            return read(self.path, offset, length, self.tag, out)
        except RemoteError as exc:
            if exc.permanent:
                raise self._fail(exc.strerror) from None
            raise self._io_error(offset, exc) from None

    def read_into(self, buf: memoryview, offset: int, length: int) -> None:
        self.pread(offset, length, buf[offset : offset + length])  # the body goes straight into the cache

    def forget(self, offset: int, length: int) -> None:
        pass  # no page cache of ours to drop

    def close(self) -> None:
        pass
