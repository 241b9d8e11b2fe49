"""What a node keeps under its home directory.

- ``durable``: the one durable writer (write, fsync, rename, fsync the directory).
"""
