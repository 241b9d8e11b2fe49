"""The overlay's request targets (protocol/overlay_routes.py): what a fetcher builds is what the
server matches, and nothing else is a route."""

from __future__ import annotations

import pytest

from intellect_node.protocol.overlay_routes import RESOURCES, ROUTE, target


@pytest.mark.parametrize("what", RESOURCES)
def test_every_step_resource_round_trips_through_the_server_pattern(what: str) -> None:
    match = ROUTE.fullmatch(target("run-1", what, 42))
    assert match is not None and (match["run"], match["step"], match["what"]) == ("run-1", "42", what)


def test_the_newest_manifest_has_no_step_and_nothing_else_does() -> None:
    assert ROUTE.fullmatch(target("run-1", "manifest"))["step"] is None
    for what in ("delta", "have", "checkpoint.safetensors"):
        with pytest.raises(ValueError, match="not an overlay route"):
            target("run-1", what)


@pytest.mark.parametrize(("run_id", "what", "step"), [
    ("Run", "manifest", 1),  # upper case is not a run id
    ("run/../x", "manifest", 1),
    ("r" * 65, "manifest", 1),
    ("run", "manifest", 10**12),  # 13 digits
    ("run", "model.bin", 1),
    ("run", "manifest", -1),
])
def test_targets_the_server_would_refuse_are_refused_here(run_id: str, what: str, step: int) -> None:
    with pytest.raises(ValueError, match="not an overlay route"):
        target(run_id, what, step)
