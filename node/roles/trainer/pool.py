"""Accepted rollouts waiting to be trained on, one durable file per group.

A group enters the pool (fsynced) before its batch leaves the inbox, and leaves the pool only
after the trainer state that consumed it is on disk; so at every instant each accepted group is in
the inbox, in the pool, or inside a saved step, and a crash (kill -9) loses none. Keys consumed by
recent steps are remembered in the trainer state, so a batch re-verified after a crash cannot put
an already trained group back.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import msgpack

from intellect_node.node.home.durable import write_durably
from intellect_node.node.roles.trainer.groups import TrainingGroup
from intellect_node.protocol.bounded_msgpack import Limits, unpack
from intellect_node.protocol.errors import Rejected

log = logging.getLogger(__name__)
SUFFIX = ".group"
# the largest group a run can accept fits: 64 completions of 32768 tokens, each with its logprobs
GROUP_FILE_LIMITS = Limits(max_bytes=64 << 20, max_str_len=256, max_bin_len=0, max_array_len=1 << 16,
                           max_map_len=16, max_objects=5_000_000, max_depth=4)
KEY = re.compile(r"[0-9a-f]{64}:[0-9]{1,10}")


class GroupPool:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        for leftover in directory.glob(f"*{SUFFIX}.tmp*"):
            leftover.unlink(missing_ok=True)
        self.groups: dict[str, TrainingGroup] = {}

    def _path(self, key: str) -> Path:
        if not KEY.fullmatch(key):
            raise ValueError(f"not a group key: {key[:80]!r}")
        return self.directory / (key.replace(":", "-") + SUFFIX)

    def load(self, consumed: Iterable[str]) -> int:
        """Read the groups left on disk, dropping those a saved step already consumed."""
        consumed = set(consumed)
        for path in sorted(self.directory.glob(f"*{SUFFIX}")):
            try:
                group = TrainingGroup.from_wire(unpack(path.read_bytes(), GROUP_FILE_LIMITS, "pooled group"))
            except (Rejected, OSError, KeyError, TypeError, ValueError) as exc:  # damaged: set aside, no crash loop
                log.warning("setting aside unreadable pooled group %s: %s", path.name, exc)
                path.replace(path.with_suffix(".damaged"))
                continue
            if group.key in consumed:
                path.unlink(missing_ok=True)
            else:
                self.groups[group.key] = group
        return len(self.groups)

    def persist(self, groups: Iterable[TrainingGroup]) -> None:
        """Write the groups durably (file I/O only: safe in a worker thread); then ``admit`` them."""
        for group in groups:
            write_durably(self._path(group.key), msgpack.packb(group.to_wire()), tmp_suffix=".tmp")

    def admit(self, groups: Iterable[TrainingGroup]) -> None:
        for group in groups:
            self.groups[group.key] = group

    def discard(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.groups.pop(key, None)
            self._path(key).unlink(missing_ok=True)

    def newest_first(self, admits: Callable[[str, int, int], bool] | None = None,
                     fills: Callable[[str], bool] | None = None) -> list[TrainingGroup]:
        """The pooled groups, newest policy step first, each step's in key order (deterministic).
        A trainer fills its batch from the front: every step of lag costs learning per step
        (bench/HISTORY.md, "Staleness per step"), and an older group is still used while newer
        ones do not fill a batch. ``admits(worker, policy_step, counter)``: only the groups it
        admits (the judge's delivery standing and step cap, node/roles/validator/delivery.py); the
        rest stay pooled until admitted or their step leaves the window. ``fills(worker)``: of the
        rest, the groups of the workers it names follow at the back, newest first, so they are
        trained on only where the admitted ones do not fill a batch (a step's surplus above its
        worker's cap: specs/rollouts.md, "Delivery standing", rule 5)."""
        front, back = self.admitted_then_surplus(admits, fills)
        return front + back

    def admitted_then_surplus(self, admits: Callable[[str, int, int], bool] | None,
                              fills: Callable[[str], bool] | None = None,
                              ) -> tuple[list[TrainingGroup], list[TrainingGroup]]:
        """``newest_first``'s two parts, each newest first: what ``admits`` admits (everything
        without it), and of the rest what ``fills`` names (nothing without it)."""
        def order(groups: Iterable[TrainingGroup]) -> list[TrainingGroup]:
            return sorted(groups, key=lambda g: (-g.policy_step, g.key))

        if admits is None:
            return order(self.groups.values()), []
        admitted = {key for key, g in self.groups.items() if admits(g.worker, g.policy_step, g.counter)}
        front = order(self.groups[key] for key in admitted)
        if fills is None:
            return front, []
        return front, order(g for key, g in self.groups.items() if key not in admitted and fills(g.worker))

    def __len__(self) -> int:
        return len(self.groups)
