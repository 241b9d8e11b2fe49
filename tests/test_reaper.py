"""The conftest reaper ends what a test left running, grandchildren included, and names it."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from tests.support.reaper import reap_children


def test_leftover_processes_are_reaped_and_named() -> None:
    # A child that ignores SIGTERM and has a child of its own: both must be gone afterwards.
    stubborn = subprocess.Popen([sys.executable, "-c", (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)")])
    try:
        for _ in range(200):  # until the grandchild exists
            if psutil.Process(stubborn.pid).children():
                break
            time.sleep(0.05)
        family = [psutil.Process(stubborn.pid), *psutil.Process(stubborn.pid).children(recursive=True)]
        assert len(family) == 2
        with pytest.warns(UserWarning, match="left 2 process"):
            reaped = reap_children("this test")
        assert any(str(stubborn.pid) in r for r in reaped)
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family)
    finally:
        stubborn.kill()
        stubborn.wait()


def test_nothing_to_reap_is_silent(recwarn: pytest.WarningsRecorder) -> None:
    assert reap_children("a clean test") == []
    assert not recwarn.list
