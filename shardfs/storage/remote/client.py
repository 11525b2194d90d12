"""Requests to remote stores: one client per scheme and process, with the storage options the
user gave, retries of transient errors with backoff (each logged), and request counters.

Each request, retries included, ends within a deadline: ``deadline.TIMEOUT`` (30 s) for reads
and HEADs, which FUSE workers wait for; ``LONG_TIMEOUT`` for listings and index files, fetched
at mount and rescan. A host (an S3 bucket) whose request ran out of time without any answer is
not answering: its requests fail at once (EIO) until a probe gets an answer (deadline.Place)."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import threading
import time

from shardfs.errors import UsageError
from shardfs.redact import is_secret, redact, redact_options, remember_secrets
from shardfs.storage import deadline
from shardfs.storage.remote.errors import ObjectInfo, RemoteError

log = logging.getLogger(__name__)

RETRIES = int(os.environ.get("SHARDFS_REMOTE_RETRIES", "6"))  # attempts per request, within its deadline
LONG_TIMEOUT = 300.0  # listings and index files: not on a FUSE worker's path, maybe large
BACKOFF = 0.2  # seconds before the first retry; doubles each time (with jitter), capped
BACKOFF_CAP = 5.0
OPTIONS_ENV = "SHARDFS_STORAGE_OPTIONS"  # how a detaching mount hands options to its daemon (not argv)


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
    remember_secrets(_options)
    _stores.clear()


def options_from_env() -> dict:
    text = os.environ.pop(OPTIONS_ENV, None)
    return json.loads(text) if text else {}



_stores: dict[tuple[str, int], object] = {}
_stores_lock = threading.Lock()


def store_for(url: str):
    """One fsspec filesystem per scheme and process (a forked index worker makes its own)."""
    from shardfs.storage.remote.backends import HTTPStore, S3Store  # asyncio and ssl: only for URLs

    kind = "s3" if url.startswith("s3://") else "http"
    key = (kind, os.getpid())
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            try:
                store = _stores[key] = (S3Store if kind == "s3" else HTTPStore)(_options)
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


def call(what: str, make, url: str, *args, optional: bool = False, within: float | None = None):
    """Run ``make(url, *args)`` (a coroutine function of a backend) on fsspec's loop; retry
    transient errors until ``within`` seconds (default deadline.TIMEOUT) have passed.
    ``optional``: the object may well not exist (a 404 is not counted as a failure)."""
    import asyncio

    import fsspec.asyn

    store = make.__self__
    where = _place_of(url)
    try:
        where.admit()
    except deadline.NotAnswering as exc:
        _count("failed")
        raise RemoteError(f"{what}: {exc}", permanent=False) from None
    within = deadline.TIMEOUT if within is None else within
    ends = time.monotonic() + within
    answered = False  # any answer at all, even a 503: the store is there
    for attempt in range(1, RETRIES + 1):
        _count("requests")
        left = max(ends - time.monotonic(), 0.001)
        try:
            result = fsspec.asyn.sync(store.loop, asyncio.wait_for, make(url, *args), left)
            where.answered()
            return result
        except RemoteError as exc:
            error, answered = exc, answered or exc.status is not None
        except (asyncio.TimeoutError, TimeoutError) as exc:
            error = RemoteError(f"{what}: no answer (timed out)", permanent=False)
            error.__cause__ = exc
        except Exception as exc:  # connecting, signing, ...: whatever it is, retried and logged
            error = RemoteError(f"{what}: {type(exc).__name__}: {exc}", permanent=False)
        delay = min(BACKOFF * 2 ** (attempt - 1), BACKOFF_CAP) * random.uniform(0.5, 1.0)
        out_of_time = time.monotonic() + delay >= ends
        if error.permanent or attempt == RETRIES or out_of_time:
            if error.permanent or answered:
                where.answered()
            elif out_of_time:
                where.timed_out()
            if not (optional and error.status in (403, 404, 410)):
                _count("failed")
            if not error.permanent:
                error.strerror = (f"{error.strerror} (gave up after {attempt} attempts"
                                  f"{f' and {within:.0f} s' if out_of_time else ''})")
            raise error
        _count("retries")
        log.warning("%s; retry %d of %d in %.2f s", error, attempt, RETRIES - 1, delay)
        time.sleep(delay)
    raise AssertionError("unreachable")


def _place_of(url: str) -> deadline.Place:
    """Requests to one host (one S3 bucket) fail or recover together."""
    scheme, _, rest = url.partition("://")
    return deadline.place(f"{scheme}://{rest.split('/', 1)[0]}")


def info(url: str) -> ObjectInfo:
    store = store_for(url)
    return call(f"HEAD {url}", store.info, url)


def read(url: str, offset: int, length: int, tag: str | None, out: memoryview | None = None):
    """Exactly ``length`` bytes at ``offset`` of the object as it was when tagged ``tag``:
    returned, or written into ``out`` (a memoryview of that length); within deadline.TIMEOUT."""
    store = store_for(url)
    what = f"GET {url} bytes {offset}-{offset + length - 1}"
    ends = time.monotonic() + deadline.TIMEOUT
    for attempt in range(1, RETRIES + 1):
        data = call(what, store.get, url, offset, length, tag, out, within=ends - time.monotonic())
        got = data if out is not None else len(data)
        if got == length:
            _count("bytes", length)
            return data
        # A cut connection the client did not notice: never hand on a short body.
        if attempt == RETRIES or time.monotonic() >= ends:
            raise RemoteError(f"{what}: short body ({got} bytes) after {attempt} attempts", permanent=False)
        _count("retries")
        log.warning("%s: short body (%d of %d bytes); retrying", what, got, length)
    raise AssertionError("unreachable")


def read_whole(url: str) -> bytes | None:
    """The whole object, or None if there is none (an optional file such as an index)."""
    store = store_for(url)
    try:
        return call(f"GET {url}", store.get, url, 0, None, None, optional=True, within=LONG_TIMEOUT)
    except RemoteError as exc:
        if exc.status in (403, 404, 410):
            return None
        raise
