"""The ``intellect-node`` command line (typer). Thin: parses, loads config, calls ``node``."""
