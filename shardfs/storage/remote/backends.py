"""The two kinds of store, each as a small async client: S3 (and compatibles) through s3fs's
aiobotocore client, and HTTP(S) servers with Range support through fsspec's HTTPFileSystem.
Every GET is conditional on the object's tag and its answer checked (ETag, Content-Range,
length), so an object changed under a mount gives a permanent error, never other bytes."""

from __future__ import annotations

import asyncio
import logging
import re

from shardfs.storage.remote.errors import ObjectInfo, RemoteError, mtime_ns as _mtime_ns, status_error as _status_error

# One attempt gives up when connecting takes this long, or when the answer (its headers, or the
# next bytes of its body) is this long in coming: a store that stops answering is noticed in
# seconds, while a slow but flowing body is not cut. client.call bounds the whole request.
CONNECT_TIMEOUT, READ_TIMEOUT = 5.0, 10.0


class S3Store:
    """S3 and compatibles (MinIO, Ceph RGW, AIStore) through s3fs's aiobotocore client."""

    def __init__(self, options: dict):
        import s3fs  # lazy: only remote mounts need it

        for noisy in ("botocore", "aiobotocore", "s3fs"):  # "Found credentials in ..." at every start
            logging.getLogger(noisy).setLevel(logging.WARNING)
        options = dict(options)
        config = dict(options.pop("config_kwargs", None) or {})
        config.setdefault("retries", {"total_max_attempts": 1})  # we retry, and log it
        config.setdefault("connect_timeout", CONNECT_TIMEOUT)
        config.setdefault("read_timeout", READ_TIMEOUT)
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

    async def listing(self, url: str, wanted) -> tuple[list[ObjectInfo], list[str]]:
        """``wanted`` objects directly under a prefix (not recursive, like a local directory), and every URL there."""
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
                    return [o for o in found if wanted(o.url)], [o.url for o in found]
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


class HTTPStore:
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
        timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT, sock_read=READ_TIMEOUT)
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

    async def listing(self, url: str, wanted) -> tuple[list[ObjectInfo], list[str]]:
        """``wanted`` objects linked from a directory page (nginx autoindex and the like), and every link."""
        try:
            links = await self.fs._ls(url, detail=False)
        except Exception as exc:
            raise self._translate(f"LIST {url}", exc) from None
        shards = [link for link in links if wanted(link)]
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
