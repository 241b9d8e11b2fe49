"""The trainer's evaluations run beside its loop (``BackgroundEvaluations``): submitting never waits,
results come in step order, a waiting copy gives way to a newer step's, the running one always
finishes, and a stopping trainer does not wait for an evaluation's thread."""

from __future__ import annotations

import threading

import torch
import trio
import trio.testing

from intellect_node.node.roles.trainer.background_eval import BackgroundEvaluations


class GatedEvaluate:
    """An evaluation that returns the model's one weight once its gate opens (a worker thread);
    ``started[i]`` is set when the i-th evaluation begins."""

    def __init__(self, expected: int) -> None:
        self.gates: list[threading.Event] = []
        self.started = [trio.Event() for _ in range(expected)]

    def __call__(self, model: torch.nn.Module) -> float:
        gate = threading.Event()
        self.gates.append(gate)
        trio.from_thread.run_sync(self.started[len(self.gates) - 1].set)
        if not gate.wait(timeout=20):
            raise TimeoutError("the test never opened the gate")
        return float(model.weight.item())

    def open_all(self) -> None:
        for gate in self.gates:
            gate.set()


class Recorded:
    def __init__(self, expected: int) -> None:
        self.lines: list[tuple[int, float]] = []
        self.expected = expected
        self.done = trio.Event()

    async def __call__(self, step: int, accuracy: float) -> None:
        self.lines.append((step, accuracy))
        if len(self.lines) == self.expected:
            self.done.set()


def model_of(value: float) -> torch.nn.Module:
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(value)
    return model


async def test_submitting_does_not_wait_and_a_waiting_copy_gives_way_to_a_newer_one() -> None:
    evaluate, recorded = GatedEvaluate(expected=2), Recorded(expected=2)
    evaluations = BackgroundEvaluations(evaluate, recorded)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(evaluations.run)
            evaluations.submit(0, model_of(0.25))  # the loop hands the copy over and goes on
            await evaluate.started[0].wait()
            evaluations.submit(1, model_of(0.5))
            evaluations.submit(2, model_of(0.75))  # step 1's copy waits behind step 0's: replaced
            assert evaluations.pending == 2 and evaluations.replaced == 1
            evaluate.open_all()
            await evaluate.started[1].wait()
            evaluate.open_all()
            await recorded.done.wait()
            assert evaluations.pending == 0
            nursery.cancel_scope.cancel()
    assert recorded.lines == [(0, 0.25), (2, 0.75)]  # the starting point always, then the newest


async def test_a_stopping_trainer_does_not_wait_for_the_evaluation_thread() -> None:
    evaluate, recorded = GatedEvaluate(expected=1), Recorded(expected=1)
    evaluations = BackgroundEvaluations(evaluate, recorded)
    try:
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(evaluations.run)
                evaluations.submit(3, model_of(1.0))
                await evaluate.started[0].wait()
                nursery.cancel_scope.cancel()  # the gate is still shut: the thread is abandoned
    finally:
        evaluate.open_all()
    assert recorded.lines == [] and evaluations.pending == 0


async def test_a_failed_evaluation_is_logged_and_the_next_one_still_runs() -> None:
    recorded = Recorded(expected=1)

    def evaluate(model: torch.nn.Module) -> float:
        if model.weight.item() < 0:
            raise RuntimeError("out of memory")
        return float(model.weight.item())

    evaluations = BackgroundEvaluations(evaluate, recorded)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(evaluations.run)
            evaluations.submit(1, model_of(-1.0))
            await trio.testing.wait_all_tasks_blocked()
            evaluations.submit(2, model_of(0.5))
            await recorded.done.wait()
            nursery.cancel_scope.cancel()
    assert recorded.lines == [(2, 0.5)] and evaluations.failed == 1
