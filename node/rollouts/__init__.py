"""Rollout batches between nodes (specs/rollouts.md).

- ``exchange``: delivering signed batches to trainers and validators over ``/ina/rollouts/1.0.0``,
  and the receiving service that checks and stores them.
- ``inbox``: durable storage of received batches, keyed by the hash of their envelope.
- ``run_spec``: the RunSpec a node generates and judges by (built from settings, or loaded signed).
"""
