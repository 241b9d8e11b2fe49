"""The ``intellect-node`` command line (typer). Thin: parses, loads config, calls ``node``.

- ``main``: the application and every command but the ones below.
- ``verify``: ``intellect-node verify``, the validator's verdict on one stored batch.
"""
