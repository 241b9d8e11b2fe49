"""The ``[trainer]`` section, the fields of node.roles.trainer.service.TrainerOptions but the model,
tasks, publish directory and trusted validators (which ``join`` decides): defaults < the config
file's ``[trainer]`` < an old ``--trainer-config`` file (deprecated: the same keys, without the
``trainer.`` prefix) < environment (``INTELLECT_NODE_TRAINER_BATCH_GROUPS``; a sub-table's key by its
path, ``INTELLECT_NODE_TRAINER_OPTIM_LR``) < command-line flags. node/app/join.py loads it through
node/config's ``load_section``, which merges the sub-tables key by key across these layers.

``async_level`` is run-wide: it comes from ``[run]`` unless the trainer's section names it. The
section holds the knobs a user tunes rarely; the flags the ones a demo or a quick run sets::

    [trainer]
    batch_groups = 16
    [trainer.optim]     # node.roles.trainer.learner.OptimConfig: lr, betas, weight_decay, warmup_steps, ...
    lr = 5e-4
    [trainer.loss]      # node.roles.trainer.loss.LossConfig: clip_eps, ratio_cap, normalization, ...
    [trainer.rewards]   # node.roles.trainer.rewards.RewardConfig: length_coef, length_form

Typed by node/config: unknown keys are errors that name the key, so a typo never silently trains
with a default.
"""

from __future__ import annotations

DEPRECATED_FILE = ("--trainer-config is deprecated: move the file's keys into config.toml's [trainer] section "
                   "([optim] becomes [trainer.optim], and so on)")
