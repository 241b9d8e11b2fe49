"""The swarm plumbing every role stands on: who we are, whom we know, and how we talk to them.

A running node (``runtime.Node``) is a composition of parts, each with one job and a narrow
interface, the way hivemind splits DHT / DHTNode / DHTProtocol / traverse:

- ``runtime``: ``Node``, which builds the parts below, joins the run, runs their loops and the role
  services as tasks of one trio nursery, and answers ``status``.
- ``settings``: ``SwarmSettings``, what the swarm reads of the node's configuration (the app builds it).
- ``context``: ``NodeContext``, the narrow part of ``Node`` that services and roles are given.
- ``adverts``: ``Advertiser``, our own signed advert, repeated on gossip and stored in the DHT.
- ``member_exchange``: ``MemberExchange``, the members protocol (pull adverts from a peer) and the
  one way an advert gets into the view.
- ``discovery``: ``Discovery``, finding the run's members (DHT, anti-entropy) and keeping enough of
  them connected; the catch-up right after joining.
- ``announcements``: ``Announcements``, the run's announcements topic that services gossip on.
- ``upkeep``: ``Upkeep``, expiring members, saving the peer cache, disconnecting banned peers.
- ``nat``: reachability (dial-backs), circuit relays (service and client), hole punching, and
  ``NatTraversal``, which decides when they act.

What those parts stand on:

- ``bootstrap``: which addresses to try at start, in which order, and why a dial failed.
- ``host``: the libp2p host (Noise only, yamux), its dialable addresses, peer multiaddr parsing.
- ``yamux_window``: yamux receive credit returned once half the window is read (go-yamux), not per read.
- ``connections``: inbound admission and the connection manager (specs/connections.md).
- ``guard``: ``StreamGuard``, every stream handler under a first-byte deadline and an error count.
- ``stream_table``: one table of inbound streams per protocol: caps, request deadlines, eviction of
  the slowest incomplete request for a newcomer (specs/guards.md G3, G4).
- ``streams``: length-prefixed frames over raw libp2p streams, with limits and deadlines.
- ``loop_deadline``: deadlines on peers that a stall of this node's own event loop does not run
  out (a loaded node must not blame, and ban, the peers it was too slow to read).
- ``gossip``: gossipsub topics per run, with validators that drop and charge bad input.
- ``mesh_router``: ``SteadyGossipSub``, the gossipsub router with the spec's mesh upkeep (no
  per-heartbeat grafting churn) and a fixed gossip fan-out, so a node's cost does not grow with N.
- ``dht_get``: the bounded DHT get (the few closest peers at once, first valid reply wins).
- ``membership``: signed node adverts, their DHT record check, and the view of the run's members.
- ``peer_scores``: rejection counters by reason, per-peer penalties and bans.
- ``peer_cache``: the peers seen before, so a restart needs no bootstrap peer.
- ``supervisor``: restarts a failed loop or service; only the host's own failure ends the node.
- ``hardware``: what this machine offers (accelerators, CPU, RAM, disk).
- ``control``: the local unix socket that ``intellect-node status`` reads.
- ``query``: ask a swarm for its members without joining it.
"""
