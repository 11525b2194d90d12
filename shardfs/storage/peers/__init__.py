"""Peers: the nodes of a job serve shards to each other, so shared storage is read about once.

    shared storage --(owner reads once)--> owner's RAM cache / disk tier --(HTTP)--> other nodes

* ``addresses``: the peer list (``HOST:PORT``, as given or derived), checked, and which entry is us.
* ``owner``: who owns a shard: consistent hashing with bounded loads over the shards and peers (pure functions).
* ``auth``: the user's secret key file and the HMAC every request and reply carries.
* ``server``: answers other nodes' range requests from this node's caches (HTTP/1.1 on asyncio streams).
* ``client``: asks a peer for a range and checks the reply end to end, peer health.
* ``conns``: the client's kept HTTP/1.1 connections, bounded, used on the reading thread.
* ``net``: this node among its peers: the owners now and before, the server and client, the figures.
* ``shard``: ``PeerShard``, a ``Shard`` whose bytes come from the owner, else from storage.
"""
