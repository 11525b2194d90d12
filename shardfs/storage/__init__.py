"""Shard bytes, wherever they are stored, and the caches in front of them.

One interface (``base.ShardBytes``) reads a shard's bytes: a local file (``local``) or an object
in S3 or on an HTTP server (``remote``). Index builds scan through it and the mount serves
through it, by way of the RAM cache (``ram``) within a memory budget (``memory``).
"""
