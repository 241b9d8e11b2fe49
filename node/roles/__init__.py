"""One sub-package per role a node can take.

- ``inference``: generate rollouts on the newest verified checkpoint, prove and deliver them.
- ``validator``: recompute and judge received batches, sign and gossip verdicts, ban cheats.
- ``trainer``: verified rollouts in, GRPO updates, signed checkpoints out.
- ``policy``: ``PolicyFollower``, the engine inference and validation share: loaded once, weights
  swapped to the checkpoint the work is about, the run's newest known step.
"""
