"""What every test shares: the child-process reaper (``tests/support/reaper``), run after each test
module and once more at the end of the session. Module scope, not test scope: module fixtures
legitimately keep a swarm running across the tests of their file.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.reaper import reap_children


@pytest.fixture(scope="module", autouse=True)
def reap_after_module(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    reap_children(request.module.__name__)


def pytest_sessionfinish(session: pytest.Session) -> None:
    reap_children("the test session")
