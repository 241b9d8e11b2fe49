"""The demo's shipping record (node/demo/shipping.py), read from the overlay's own status files:
bytes a step shipped and seconds from the trainer's publish to the last worker holding it."""

import json
from pathlib import Path
from types import SimpleNamespace

from intellect_node.node.demo.shipping import ShippingLog


def write_status(home: Path, steps: dict) -> None:
    (home / "shards").mkdir(parents=True, exist_ok=True)
    (home / "shards" / "status.json").write_text(json.dumps({"steps": steps}))


def held(total: int, delta: int | None, fmt: str | None, at: float | None, complete: bool = True) -> dict:
    return {"total_size": total, "delta_size": delta, "delta_format": fmt, "completed_at": at, "complete": complete}


def test_steps_are_remembered_after_nodes_drop_them_and_reach_the_last_worker(tmp_path):
    names = ("trainer", "inference0", "inference1", "validator")
    swarm = SimpleNamespace(nodes={n: SimpleNamespace(home=tmp_path / n) for n in names})
    log = ShippingLog()
    write_status(tmp_path / "trainer", {"0": held(1000, None, None, 100.0), "1": held(1000, 40, "lora/v1", 110.0)})
    write_status(tmp_path / "inference0", {"0": held(1000, None, None, 101.0), "1": held(1000, 40, "lora/v1", 111.5)})
    write_status(tmp_path / "inference1", {"1": held(1000, 40, "lora/v1", None, complete=False)})
    write_status(tmp_path / "validator", {"1": held(1000, 40, "lora/v1", 190.0)})  # not a worker: not counted
    log.poll(swarm)
    assert log.to_last_worker_s() == {}  # inference1 holds step 1 only partly
    write_status(tmp_path / "inference1", {"1": held(1000, 40, "lora/v1", 113.0),
                                           "2": held(1000, 60, "sparse/v2", 120.5)})
    write_status(tmp_path / "trainer", {"2": held(1000, 60, "sparse/v2", 120.0)})  # step 0 and 1 pruned there
    write_status(tmp_path / "inference0", {"2": held(1000, 60, "sparse/v2", 120.2)})
    (tmp_path / "validator" / "shards" / "status.json").write_text("{not json")  # mid-write: skipped
    log.poll(swarm)
    assert log.to_last_worker_s() == {1: 3.0, 2: 0.5}
    summary = log.summary()
    assert summary["steps_by_format"] == {"lora/v1": 1, "sparse/v2": 1}
    assert summary["shipped_bytes_per_step"] == 50 and summary["checkpoint_bytes"] == 1000
    assert summary["step_to_last_worker_s_median"] == 1.75 and summary["step_to_last_worker_s_max"] == 3.0
    assert "0.00 MB of 0 MB" in log.line()


def test_nothing_seen_yet(tmp_path):
    log = ShippingLog()
    log.poll(SimpleNamespace(nodes={"trainer": SimpleNamespace(home=tmp_path / "none")}))
    assert log.summary()["shipped_bytes_per_step"] is None and log.line() == "-"
