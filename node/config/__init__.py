"""The configuration machinery every package shares, at the bottom of the dependency arrows.

- ``base``: ``ConfigError``, strict typing of one section's values, bounds.
- ``loader``: the TOML file, and ``load_section``, the one loader of every section: defaults <
  file < environment < flags, sub-tables merged key by key.

Each section's class lives with its concern (node/shards/config.py, node/diloco/settings.py, ...)
and states its own bounds in ``__post_init__``; node/app/config.py composes the root, and
node/app/join.py loads each role's sections through ``load_section``.
"""
