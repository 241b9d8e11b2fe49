"""The weight broadcast overlay (SHARDCAST, done right): signed manifests, verified shards, a swarm.

- ``intellect_node.node.shards.service``: ``ShardService``, the node service and facade that ties the rest
  together: manifest intake, fetch orchestration, retention, completion.
- ``intellect_node.node.shards.status_file``: ``<data_dir>/status.json``, what the overlay holds, fetched, uploaded.
- ``intellect_node.node.shards.publisher``: the trainer's side: each dropped checkpoint signed, held, gossiped.
- ``intellect_node.node.shards.delta_follower``: a step built from a held base and its delta, fetched from a holder.
- ``intellect_node.node.shards.delta_relay``: delta bodies handed to a few by each node, then passed on: a tree.
- ``intellect_node.node.shards.copy_ahead``: the next delta's base, copied while the swarm works on this step.
- ``intellect_node.node.shards.provider``: DHT provider records, queued and spaced out; a shard's providers.
- ``intellect_node.node.shards.discovery``: members advertising a newer step; their manifests.
- ``intellect_node.node.shards.complaints``: signed complaints about bad shards, made and heard on gossip.
- ``intellect_node.node.shards.checkpoint``: safetensors out of tensors; tensor index, shard hashes, manifest.
- ``intellect_node.node.shards.store``: checkpoints on disk, partial until verified, atomic completion, retention.
- ``intellect_node.node.shards.server``: what to answer (verified ranges, upload caps, seed mode); HTTP serving.
- ``intellect_node.node.shards.client``: the HTTP client that checks every answer against what it asked.
- ``intellect_node.node.shards.http``: shared HTTP plumbing (heads, bodies, stall windows, signed peer header).
- ``intellect_node.node.shards.stream_wire``: ``/ina/shards/1.0.0``, the routes over libp2p: request, head frames.
- ``intellect_node.node.shards.stream_server``: serving that protocol (peers that cannot dial our HTTP server).
- ``intellect_node.node.shards.stream_client``: fetching over it from peers without a dialable HTTP address.
- ``intellect_node.node.shards.fetcher``: which shard from which parent; retries, penalties, complaints.
- ``intellect_node.node.shards.deltas``: deltas and adapters on disk: made by the trainer, built on by followers.
- ``intellect_node.node.shards.loader``: tensors as views into one mmapped file.
- ``intellect_node.node.shards.progress``: a rich bar per checkpoint (log lines when not on a terminal).
- ``intellect_node.node.shards.config``: the overlay's settings (environment and flags).

The message types are in ``intellect_node.protocol.manifest``; specs/shardcast.md is the normative description.
"""
