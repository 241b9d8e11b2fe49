"""The weight broadcast overlay (SHARDCAST, done right): signed manifests, verified shards, a swarm.

- ``node.shards.service``: ``ShardService``, the node service that ties the rest together.
- ``node.shards.checkpoint``: safetensors out of tensors; tensor index, shard hashes, manifest.
- ``node.shards.store``: checkpoints on disk, partial until verified, atomic completion, retention.
- ``node.shards.server``: the HTTP server of verified ranges, with upload caps and seed mode.
- ``node.shards.client``: the HTTP client that checks every answer against what it asked.
- ``node.shards.http``: shared HTTP plumbing (heads, bodies, stall windows, signed peer header).
- ``node.shards.fetcher``: which shard from which parent; retries, penalties, complaints.
- ``node.shards.loader``: tensors as views into one mmapped file.
- ``node.shards.progress``: a rich bar per checkpoint (log lines when not on a terminal).
- ``node.shards.config``: the overlay's settings (environment and flags).

The message types are in ``protocol.manifest``; specs/shardcast.md is the normative description.
"""
