"""The trainer role: verified rollouts in, GRPO updates, signed checkpoints out.

- ``service``: ``TrainerService``, the node service: verify, pool, train, save, publish, repeat.
- ``config``: the ``[trainer]`` section's types, torch-free: ``TrainerOptions`` and its ``OptimConfig``,
  ``LossConfig``, ``RewardConfig``, ``LoraConfig``.
- ``groups``: a verified GRPO group as the trainer keeps it.
- ``pool``: accepted groups waiting to be trained on, one durable file each.
- ``rewards``: task and length rewards, group advantages, the online filter.
- ``loss``: the GRPO objective with INTELLECT-2's two-sided clipping.
- ``learner``: one GRPO update from a batch of groups; compute only.
- ``lora``: low-rank adapters: train and ship a few small matrices, the base frozen.
- ``lora_publish``: a LoRA step as it ships: the adapter body and the exactly merged checkpoint.
- ``publish_checkpoint``: a trained step written whole into the publish directory the overlay reads.
- ``sharded``: the learner sharded with FSDP2 over several processes (specs/trainer_sharding.md).
- ``ranks``: one trainer in N processes: rank 0 leads the learner and runs the node, the rest follow.
- ``launch``: starts those processes with torchrun (``join --role trainer --nproc N``).
- ``state``: weights, optimizer, step and counters, saved atomically.
- ``evaluation``: held-out greedy accuracy.
- ``background_eval``: the trainer's evaluations, on a copy of the policy beside its loop.
"""
