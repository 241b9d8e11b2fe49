"""Cryptography for intellect-node: everything that proves who said what, and what was computed.

- ``intellect_node.crypto.identity``: the node's Ed25519 key (stored 0600 in the node's home) and the libp2p
  peer ID derived from the same key, so a signature and a connection name the same peer.
- ``intellect_node.crypto.envelope``: signed envelopes with domain separation, timestamp and expiry.
- ``intellect_node.crypto.toploc``: TOPLOC activation proofs (build and verify), byte-compatible with the
  reference package but strict about malformed input, and bound to their row, step and chunk by a public
  mask (a row key from ``protocol.rollouts.proof_key``).

Nothing here imports ``node``; nothing here touches the network.
"""
