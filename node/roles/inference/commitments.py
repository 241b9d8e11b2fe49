"""What an honest worker has committed to (specs/rollouts.md, "Committed assignments").

As soon as it holds checkpoint ``s`` the worker commits for ``s + 1`` to every judge it delivers
to, before anyone knows that step's tasks, and generates on a step >= 1 only the counters some
judge stored a commitment for. ``CommitmentPlan`` is the bookkeeping of that, without I/O: which
judges were sent the commitment of a step (a judge that appears later is sent it too, while the
step's checkpoint is still unknown), how many groups it names, and how many counters it covers.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from intellect_node.protocol.run_spec import DEFAULT_MAX_GROUPS_PER_STEP

# Checkpoint 0 exists before anyone can commit: generated on without a commitment (warm-up)
WARM_UP_STEP = 0
# answers that leave a commitment standing at the judge (duplicate: the reply to an earlier try was lost)
HELD = frozenset({"stored", "duplicate"})
# a judge the commitment did not reach (after ``deliver``'s own retries) is tried again this much later:
# a judge restarting must still get it, a dead one must not hold up every round of generation
RETRY_FAILED_S = 30.0
# the least a worker commits to, in batches: a step whose committed counters all run out before the
# trainer has its batch waits for workers that wait for it, while a surplus costs only its reward-0
# settlement
MIN_BATCHES = 4


@dataclass
class StepCommitment:
    """One step's commitment: its size (fixed once sent: a judge keeps the first) and who answered what."""

    groups: int
    answers: dict[str, str] = field(default_factory=dict)  # judge peer id -> its answer
    failed_at: dict[str, float] = field(default_factory=dict)  # judge -> when it last could not be reached

    def covered(self) -> int | None:
        """Counters covered: ``groups`` once a judge holds it and none answered ``late`` (that
        judge would refuse every group as ``uncommitted``: the trainer, which knows its own
        checkpoint first, most often), 0 otherwise, None (no bound) when every judge answered
        ``not_judging`` (nobody there judges with commitments)."""
        values = set(self.answers.values())
        if values & HELD and "late" not in values:
            return self.groups
        if values and values == {"not_judging"}:
            return None
        return 0


class CommitmentPlan:
    """The worker's commitments for the steps of its async window."""

    def __init__(self, groups_per_batch: int, groups_per_step: int, async_window: int) -> None:
        self.per_batch, self.groups_per_step, self.window = groups_per_batch, groups_per_step, async_window
        self.steps: dict[int, StepCommitment] = {}
        self.answers: Counter[str] = Counter()  # every judge's answers, for status

    def size(self, held: int, made_before: int) -> int:
        """Groups to commit for the step after ``held``: ``made_before`` (what this worker made on
        the step before; doubled when that step's commitment was used up, since then it was the
        limit, not the rate), at least twice ``groups_per_step`` (which counts informative groups
        only) and MIN_BATCHES batches, in whole batches, at most the run's cap."""
        previous = self.steps.get(held - 1)
        if previous is not None and made_before >= previous.groups:
            made_before *= 2
        groups = max(made_before, 2 * self.groups_per_step, MIN_BATCHES * self.per_batch)
        return min(-(-groups // self.per_batch) * self.per_batch, DEFAULT_MAX_GROUPS_PER_STEP)

    def to_send(self, step: int, judges: list[str], groups: int, now: float | None = None) -> list[str]:
        """The judges to send the commitment of ``step`` now (created with ``groups`` if new): those
        not sent it yet, and those it did not reach RETRY_FAILED_S ago."""
        entry = self.steps.setdefault(step, StepCommitment(groups))
        now = time.monotonic() if now is None else now
        return [judge for judge in judges if judge not in entry.answers or entry.answers[judge] == "early"
                or (entry.answers[judge] == "failed" and now - entry.failed_at[judge] >= RETRY_FAILED_S)]

    def answered(self, step: int, judge: str, answer: str, now: float | None = None) -> None:
        """A judge's answer is final, except ``failed`` (not reached: tried again later) and
        ``early`` (the judge is behind: asked again next round)."""
        entry = self.steps[step]
        entry.answers[judge] = answer
        if answer == "failed":
            entry.failed_at[judge] = time.monotonic() if now is None else now
        self.answers[answer] += 1

    def covered(self, step: int, next_counter: int) -> int | None:
        """Counters of ``step`` this worker may still generate (None: no bound, warm-up or no judge
        keeps commitments)."""
        if step == WARM_UP_STEP:
            return None
        entry = self.steps.get(step)
        total = entry.covered() if entry is not None else 0
        return None if total is None else max(0, total - next_counter)

    def step_to_generate(self, held: Sequence[int], next_counter: Callable[[int], int],
                         share_done: Callable[[int], bool]) -> int:
        """The step to generate on, of ``held`` (the complete steps of the async window, newest
        first): the newest, unless no judge holds this worker's commitment for it (it learned of
        that step only after the judges did: a trainer resuming from its pool publishes several
        steps at once). Then the newest older step with committed counters left and its share not
        done, so that trainer and worker do not wait for each other (the trainer for groups, the
        worker for a step it committed to). Those counters are owed anyway: undelivered, they are
        settled as reward 0."""
        newest = held[0]
        if newest == WARM_UP_STEP or self.covered(newest, 0) != 0:
            return newest
        for step in held[1:]:
            if self.covered(step, next_counter(step)) != 0 and not share_done(step):
                return step
        return newest

    def forget_before(self, step: int) -> None:
        self.steps = {s: e for s, e in self.steps.items() if s >= step}
