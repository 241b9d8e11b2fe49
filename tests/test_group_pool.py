"""The trainer's durable pool: what a restart finds in it, and the order a batch is filled in."""

from __future__ import annotations

from pathlib import Path

import pytest

from intellect_node.node.roles.trainer.groups import TrainingGroup
from intellect_node.node.roles.trainer.pool import GroupPool


def group(batch: int, counter: int, policy_step: int, worker: str = "w") -> TrainingGroup:
    return TrainingGroup(key=f"{batch:064x}:{counter}", worker=worker, policy_step=policy_step, task_id="t",
                         length_target=16, prompt=(5, 6), completions=((7, 1), (8, 1)), task_rewards=(1.0, 0.0),
                         logprobs=((-0.5, -0.1), (-1.5, -0.2)))


def pooled(directory: Path, groups: list[TrainingGroup]) -> GroupPool:
    pool = GroupPool(directory)
    pool.persist(groups)
    pool.admit(groups)
    return pool


def test_newest_policy_step_first_and_in_key_order_within_a_step(tmp_path: Path) -> None:
    groups = [group(3, 0, 4), group(1, 2, 6), group(2, 0, 5), group(1, 0, 6), group(9, 1, 4), group(0, 7, 5)]
    pool = pooled(tmp_path, groups)
    ordered = pool.newest_first()
    assert [g.policy_step for g in ordered] == [6, 6, 5, 5, 4, 4]
    assert [g.key for g in ordered] == [group(1, 0, 6).key, group(1, 2, 6).key, group(0, 7, 5).key,
                                        group(2, 0, 5).key, group(3, 0, 4).key, group(9, 1, 4).key]
    # insertion order does not matter: two trainers holding the same groups fill the same batch
    assert [g.key for g in pooled(tmp_path / "other", list(reversed(groups))).newest_first()] == \
        [g.key for g in ordered]


def test_admitted_groups_come_first_and_only_standing_workers_surplus_fills_behind_them(tmp_path: Path) -> None:
    """The trainer's order under delivery standing: groups under their worker's step cap, newest
    first; then the surplus (over the cap) of workers with standing, newest first, to fill a batch the
    admitted ones cannot; a worker without standing contributes nothing."""
    groups = [group(1, 0, 6, "a"), group(1, 5, 6, "a"), group(2, 0, 5, "a"), group(2, 4, 5, "a"),
              group(3, 0, 6, "b"), group(3, 6, 6, "b")]
    pool = pooled(tmp_path, groups)
    under_cap = {"a": 4, "b": 0}  # b has no standing: nothing of it is admitted, and it does not fill

    def admits(worker: str, step: int, counter: int) -> bool:
        return counter < under_cap[worker]

    def fills(worker: str) -> bool:
        return worker == "a"

    assert [(g.worker, g.policy_step, g.counter) for g in pool.newest_first(admits)] == [("a", 6, 0), ("a", 5, 0)]
    assert [(g.worker, g.policy_step, g.counter) for g in pool.newest_first(admits, fills=fills)] == [
        ("a", 6, 0), ("a", 5, 0), ("a", 6, 5), ("a", 5, 4)]
    assert len(pool.newest_first()) == 6  # nothing dropped


def test_a_restart_finds_every_unconsumed_group_and_drops_the_consumed(tmp_path: Path) -> None:
    groups = [group(1, c, 3) for c in range(4)]
    pooled(tmp_path, groups)
    restarted = GroupPool(tmp_path)
    assert restarted.load(consumed=[groups[1].key]) == 3
    assert {g.key for g in restarted.newest_first()} == {groups[0].key, groups[2].key, groups[3].key}
    assert restarted.groups[groups[0].key] == groups[0]  # tokens, rewards and logprobs survive intact
    assert len(list(tmp_path.glob("*.group"))) == 3  # the consumed group's file is gone


def test_discard_removes_the_file_and_a_bad_key_is_refused(tmp_path: Path) -> None:
    groups = [group(1, 0, 2), group(1, 1, 2)]
    pool = pooled(tmp_path, groups)
    pool.discard([groups[0].key])
    assert len(pool) == 1 and GroupPool(tmp_path).load(consumed=[]) == 1
    with pytest.raises(ValueError, match="not a group key"):
        pool.persist([TrainingGroup(key="../escape:1", worker="w", policy_step=0, task_id="t", length_target=None,
                                    prompt=(1,), completions=((2,),), task_rewards=(0.0,), logprobs=())])


@pytest.mark.parametrize("damage", [b"", b"\xc1", b"\x91" * 100_000, b"\x81\xa3key\x01", b"\xdd\xff\xff\xff\xff"])
def test_a_damaged_pool_file_is_set_aside_not_a_crash(tmp_path: Path, damage: bytes) -> None:
    """A pooled group damaged on disk (torn, garbage, absurdly nested, the wrong shape) is renamed
    ``.damaged`` at load and the rest of the pool is read: a restart never crash-loops on it."""
    pooled(tmp_path, [group(1, 0, 3), group(2, 0, 3)])
    (tmp_path / f"{1:064x}-0.group").write_bytes(damage)
    again = GroupPool(tmp_path)
    assert again.load(consumed=()) == 1 and f"{2:064x}:0" in again.groups
    assert (tmp_path / f"{1:064x}-0.damaged").exists()
