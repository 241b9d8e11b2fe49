"""The running node: a trio program around a py-libp2p host.

- ``node.config``: configuration from TOML file, environment and flags.
- ``node.hardware``: what this machine offers (accelerators, CPU, RAM, disk).
- ``node.host``: the libp2p host (noise only, yamux), bootstrap and the persistent peer cache.
- ``node.gossip``: gossipsub topics per run with validators that drop and penalize bad input.
- ``node.membership``: signed adverts in the DHT, heartbeats, and the view of the run's nodes.
- ``node.peer_scores``: rejection counters and per-peer penalties.
- ``node.control``: the local control socket that ``intellect-node status`` reads.
- ``node.runtime``: wires the parts above into one node that runs until cancelled.
"""
