"""What every test shares: the child-process reaper (``tests/support/reaper``), run after each test
module and once more at the end of the session. Module scope, not test scope: module fixtures
legitimately keep a swarm running across the tests of their file. And ``demo_model``, the demo's
tiny model (its shipped weights) as a session fixture; the tests that use it time only their own body
(``@pytest.mark.timeout(..., func_only=True)``), from when the model was built per session.
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


def pytest_sessionfinish(session: pytest.Session) -> None:
    reap_children("the test session")
