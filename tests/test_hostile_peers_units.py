"""In-process parts of issue 21's guards: the service supervisor, the bounded member table and
its members response, and decoding limits. Real nodes on 127.0.0.1 where a node is involved."""

import trio

from tests.inprocess_nodes import make_node

RUN = "guard-units"


class FailsTwice:
    """A service that raises twice before it settles: the node must keep running meanwhile."""

    def __init__(self) -> None:
        self.starts = 0

    async def run(self, node, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.starts += 1
        task_status.started()
        if self.starts <= 2:
            raise RuntimeError(f"failure number {self.starts}")
        await trio.sleep_forever()


async def test_failing_service_is_restarted_and_shown_in_status(tmp_path, nursery):
    service = FailsTwice()
    node = make_node(tmp_path, "node", RUN, services=[service])
    await nursery.start(node.run)
    with trio.fail_after(10):  # backoff 1 s, then 2 s
        while service.starts < 3:
            await trio.sleep(0.1)
    await trio.sleep(0.1)
    state = node.snapshot()["services"]["FailsTwice"]
    assert state == {"state": "running", "restarts": 2, "last_error": "RuntimeError: failure number 2"}
    assert node.snapshot()["services"]["advertise_loop"]["state"] == "running"
