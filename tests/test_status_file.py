"""The overlay's status.json is rewritten after a change, at most every STATUS_EVERY_S, and a node
at rest does not wake to look (node/shards/status_file.py; issue 51's idle cost)."""

from __future__ import annotations

import json

import trio

from intellect_node.node.shards.status_file import STATUS_EVERY_S, StatusFile
from tests.support.waiting import poll_until


async def test_written_once_at_start_again_after_changes_and_not_at_rest(tmp_path) -> None:
    reports: list[int] = []

    def report() -> dict[str, int]:
        reports.append(len(reports))
        return {"report": len(reports)}

    path = tmp_path / "status.json"
    status = StatusFile(path, report)
    steps = 0

    class CountSteps(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            nonlocal steps
            steps += task.name.endswith("StatusFile.run")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(status.run)
        await poll_until(lambda: path.exists(), 5)
        assert json.loads(path.read_text()) == {"report": 1}
        trio.lowlevel.add_instrument(counter := CountSteps())
        await trio.sleep(STATUS_EVERY_S * 4)  # at rest
        trio.lowlevel.remove_instrument(counter)
        assert len(reports) == 1
        assert steps <= 1  # the interval's end, then it waits for a change: no polling

        for _ in range(5):  # a burst of changes: one write now, one after the interval at most
            status.mark_dirty()
        await poll_until(lambda: len(reports) >= 2, 5)
        await trio.sleep(STATUS_EVERY_S * 3)
        assert 2 <= len(reports) <= 3
        status.mark_dirty()
        await poll_until(lambda: json.loads(path.read_text())["report"] == len(reports) and len(reports) >= 3, 5)
        nursery.cancel_scope.cancel()
