"""Peers: the nodes of a job serve shards to each other, so shared storage is read about once.

    shared storage --(owner reads once)--> owner's RAM cache / disk tier --(HTTP)--> other nodes

* ``addresses``: the peer list (``HOST:PORT``, as given or derived), checked, and which entry is us.
* ``owner``: who owns a shard: rendezvous hashing of its identity and the peer names (a pure function).
* ``auth``: the user's secret key file and the HMAC every request and reply carries.
* ``server``: answers other nodes' range requests from this node's caches (aiohttp).
* ``client``: asks a peer for a range and checks the reply end to end (aiohttp), peer health.
* ``shard``: ``PeerShard``, a ``Shard`` whose bytes come from the owner, else from storage.

aiohttp is imported only when a mount has peers.
"""
