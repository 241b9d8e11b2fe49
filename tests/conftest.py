"""What every test shares: the child-process reaper (``tests/support/reaper``), run after each test
module and once more at the end of the session. Module scope, not test scope: module fixtures
legitimately keep a swarm running across the tests of their file. And ``demo_model``, the demo's
tiny model (its shipped weights) as a session fixture; the tests that use it time only their own body
(``@pytest.mark.timeout(..., func_only=True)``), from when the model was built per session. And the
order of files: those holding slow end-to-end runs first, for the two workers of the test command.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.engine_helpers import demo_tiny_model
from tests.support.reaper import reap_children


@pytest.fixture(scope="session")
def demo_model() -> Path:
    """The demo's default-recipe tiny model (tests/support/engine_helpers.py: the shipped weights),
    installed once per session."""
    return demo_tiny_model()


@pytest.fixture(scope="module", autouse=True)
def reap_after_module(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    reap_children(request.module.__name__)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files holding a ``slow`` end-to-end run first, each file whole and otherwise in its place.
    The test command runs files on two workers (``-n 2 --dist loadfile``), handing out the next file
    as one ends: a long file handed out last would run alone at the end while the other worker idles
    (the demo's file, eight minutes of it, did in the first such run)."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: the rest keeps its order


def pytest_sessionfinish(session: pytest.Session) -> None:
    reap_children("the test session")
