"""The configuration machinery every package shares, at the bottom of the dependency arrows.

- ``base``: ``ConfigError``, strict typing of one section's values, bounds.
- ``loader``: the TOML file, and the layers: defaults < file < environment < flags.

Each section's class lives with its concern (node/shards/config.py, node/diloco/settings.py, ...);
node/app/config.py composes them into the one root.
"""
