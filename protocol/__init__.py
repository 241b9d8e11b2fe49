"""Wire formats and pure protocol logic; no sockets, no threads, no torch.

- ``intellect_node.protocol.schema``: the strict field validators every message is decoded through.
- ``intellect_node.protocol.codec``: bytes <-> signed, schema-checked messages (size limit before decoding).
- ``intellect_node.protocol.messages``: the message types (``NodeAdvert``, ...) and their registry.
- ``intellect_node.protocol.keys``: DHT keys and gossip topic names derived from run id and peer id.
- ``intellect_node.protocol.errors``: one exception class per rejection reason, each with a stable ``reason``.

The normative description of every byte lives in ``specs/``; this package follows it.
"""
