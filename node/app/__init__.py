"""One node process, assembled from configuration.

- ``config``: ``NodeConfig`` from defaults, the TOML file, environment and flags.
- ``join``: what ``join`` asks for turned into each role's options, checked.
- ``join_flags``: ``join``'s options as one table (flag, config key, type, bounds, help).
- ``roles``: the table of role builders: which services a node runs for its roles.
- ``doctor``: the checks of ``intellect-node doctor`` (Python, torch, ports, sandbox, ...).
- ``run``: ``run_node``: identity, hardware, the services for the configured roles, logging and a
  clean stop on SIGINT/SIGTERM.
- ``task_dump``: on SIGUSR1, every trio task's await stack in the log (a node that stalls silently).
"""
