"""One node process, assembled from configuration.

- ``config``: ``NodeConfig`` from defaults, the TOML file, environment and flags.
- ``run``: ``run_node``: identity, hardware, the services for the configured roles, logging and a
  clean stop on SIGINT/SIGTERM.
"""
