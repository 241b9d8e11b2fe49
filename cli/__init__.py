"""The ``intellect-node`` command line (typer). Thin: parses, loads config, calls ``node``.

- ``main``: the application and every command but the ones below.
- ``calibrate``: ``intellect-node calibrate``, an engine pair's tolerances measured on this machine.
- ``doctor``: ``intellect-node doctor``, one line per check of this machine with its fix.
- ``join_options``: ``join``'s typer options, made from node/app/join_flags.py's table.
- ``metagene``: ``intellect-node metagene ...``, the genomic workload's commands.
- ``model``: ``intellect-node model ...``, bringing a pretrained model into the HF layout.
- ``verify``: ``intellect-node verify``, the validator's verdict on one stored batch.
"""
