"""Listing remote folders (an S3 prefix, an HTTP directory page), and what the listing said of
each object (size, tag), so that a mount needs no HEAD per shard."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from shardfs.storage.remote.client import LONG_TIMEOUT, call, info, store_for
from shardfs.storage.remote.errors import ObjectInfo

INFO_THREADS = 16  # HEAD requests at once when a brace URL names many objects


_known: dict[str, ObjectInfo] = {}  # what the last listing said of each object
_listed: dict[str, set[str]] = {}  # folder URL -> every URL in it, as listed


def may_exist(url: str) -> bool:
    """False if ``url``'s folder was listed and it was not there: spares a GET that would 404."""
    folder = url[: url.rfind("/") + 1]
    return folder not in _listed or url in _listed[folder]


def list_folder(folder: str, wanted: Callable[[str], bool]) -> list[ObjectInfo]:
    """The objects directly under ``folder`` whose URL is ``wanted`` (shards), remembered."""
    shards, everything = call(f"LIST {folder}", store_for(folder).listing, folder, wanted,
                                 within=LONG_TIMEOUT)
    _listed[folder if folder.endswith("/") else folder + "/"] = set(everything)
    remember(shards)
    return shards


def info_many(urls: list[str]) -> list[ObjectInfo]:
    """HEAD of each URL, several at once; remembered."""
    with ThreadPoolExecutor(min(INFO_THREADS, len(urls))) as pool:
        found = list(pool.map(info, urls))
    remember(found)
    return found


def remember(objects: list[ObjectInfo]) -> None:
    for obj in objects:
        _known[obj.url] = obj


def known_info(url: str) -> ObjectInfo:
    """The object's size and tag as listed at mount (one HEAD if it was not listed)."""
    found = _known.get(url)
    return found if found is not None else info(url)


