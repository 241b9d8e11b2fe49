"""The swarm plumbing every role stands on: who we are, whom we know, and how we talk to them.

- ``runtime``: ``Node``, which runs the host, DHT, gossip, membership and control socket as tasks
  of one trio nursery, and starts the role services beside them.
- ``settings``: ``SwarmSettings``, what the swarm reads of the node's configuration (the app builds it).
- ``context``: ``NodeContext``, the narrow part of ``Node`` that services and roles are given.
- ``host``: the libp2p host (Noise only, yamux) and peer multiaddr parsing.
- ``streams``: length-prefixed frames over raw libp2p streams, with limits and deadlines.
- ``gossip``: gossipsub topics per run, with validators that drop and charge bad input.
- ``dht_get``: the bounded DHT get (the few closest peers at once, first valid reply wins).
- ``membership``: signed node adverts, their DHT record check, and the view of the run's members.
- ``peer_scores``: rejection counters by reason, per-peer penalties and bans.
- ``nat``: reachability (dial-backs), circuit relays (service and client) and hole punching.
- ``peer_cache``: the peers seen before, so a restart needs no bootstrap peer.
- ``hardware``: what this machine offers (accelerators, CPU, RAM, disk).
- ``control``: the local unix socket that ``intellect-node status`` reads.
- ``query``: ask a swarm for its members without joining it.
"""
