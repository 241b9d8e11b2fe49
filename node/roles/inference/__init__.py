"""The inference role.

- ``worker``: ``InferenceWorker``, the node service: newest verified checkpoint, assigned tasks,
  generation off the trio loop, signed batches delivered to the run's receivers.
- ``commitments``: ``CommitmentPlan``, what the worker committed to per step and which counters
  that covers (no I/O).
- ``dispatch``: ``Dispatch``, batches and commitments to every receiver at once; a slow receiver
  holds the worker back at most 10 s (its delivery goes on in the background, or waits in the outbox).
- ``outbox``: ``Outbox``, batches a receiver could not take yet (one restarting), offered again
  with backoff until taken, refused or stale (no I/O).
- ``builder``: assigned tasks -> a ``RolloutBatch`` (sampling, hidden states, proofs, rewards);
  compute only, no network.
"""
