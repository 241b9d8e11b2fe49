"""What a node keeps under its home directory.

- ``layout``: ``HomeLayout``, every path under a node's home, named once.
- ``durable``: the one durable writer (write, fsync, rename, fsync the directory).
"""
