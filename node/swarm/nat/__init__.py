"""Reaching nodes behind NAT: learn whether we are dialable, and when we are not, be reached anyway.

The order a private node goes through, and where each step lives:

- ``reachability``: are we publicly dialable, learned from peers' dial-backs (our own protocol:
  upstream's AutoNAT answers "reachable" to every NATed requester).
- ``relay_service``: circuit relay v2 hop (while public) and stop, with limits; upstream's defects fixed.
- ``relay_client``: reservations on relays while private, and dialing ``/p2p-circuit`` addresses.
- ``holepunch``: DCUtR over relayed connections, counted by outcome.
- ``traversal``: ``NatTraversal``, the part of a running node that ties them together: when to
  ask for dial-backs, which relays to hold, which addresses the advert may carry.
"""
