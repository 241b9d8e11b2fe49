"""Rollout batches between nodes (specs/rollouts.md).

- ``exchange``: delivering signed batches to trainers and validators over ``/ina/rollouts/1.0.0``,
  and the receiving service that checks and stores them.
- ``inbox``: durable storage of received batches, keyed by the hash of their envelope.
"""
