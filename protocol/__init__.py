"""Wire formats and pure protocol logic; no sockets, no threads, no torch.

- ``protocol.schema``: the strict field validators every message is decoded through.
- ``protocol.codec``: bytes <-> signed, schema-checked messages (size limit before decoding).
- ``protocol.messages``: the message types (``NodeAdvert``, ...) and their registry.
- ``protocol.keys``: DHT keys and gossip topic names derived from run id and peer id.
- ``protocol.errors``: one exception class per rejection reason, each with a stable ``reason``.

The normative description of every byte lives in ``specs/``; this package follows it.
"""
