"""Start real node processes on 127.0.0.1: used by ``intellect-node demo``, the tests and bench/.

Each node is a separate ``intellect-node`` process with its own home; the launcher reads its listen
address from its stdout and talks to it only through the public interfaces (control socket, CLI).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from intellect_node.node.swarm.control import query

STARTUP_TIMEOUT_S = 60.0
LOG_TAIL_LINES = 40  # of each node's log, in a timeout's message


@dataclass
class NodeProcess:
    name: str
    home: Path
    process: subprocess.Popen[str]
    addr: str = ""
    log_file: IO[str] | None = None

    @property
    def peer_id(self) -> str:
        return self.addr.rsplit("/p2p/", 1)[-1]

    def status(self) -> dict[str, Any]:
        return query(self.home / "control.sock")

    def status_or_empty(self) -> dict[str, Any]:
        """``status()``, or {} while the node does not answer (starting, busy, stopping)."""
        try:
            return self.status()
        except (OSError, ValueError):
            return {}

    def cpu_seconds(self) -> float | None:
        """User + system CPU time the node's process has used so far (Linux ``/proc``; None
        elsewhere or once it has exited): what a profile of a run on shared cores compares."""
        try:
            fields = (Path("/proc") / str(self.process.pid) / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15

    def member_ids(self) -> set[str]:
        try:
            return {m["peer_id"] for m in self.status()["members"]}
        except OSError:
            return set()


def wait_until(predicate: Any, timeout_s: float, poll_s: float = 0.25) -> float:
    """Seconds until ``predicate()`` held; TimeoutError past ``timeout_s``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"condition not met within {timeout_s:g} s")
        time.sleep(poll_s)
    return time.monotonic() - start


def death_report(nodes: Iterable[NodeProcess]) -> str | None:
    """Why a demo must stop because nodes exited on their own (name, exit code, log), or None."""
    dead = [node for node in nodes if node.process.poll() is not None]
    if not dead:
        return None
    return "node died: " + ", ".join(f"{n.name} (exit {n.process.returncode}, log {n.home / 'node.log'})" for n in dead)


def _node_command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "intellect_node.cli.main", *args]


@dataclass
class LocalSwarm:
    root: Path
    run_id: str = "local-demo"
    timing: dict[str, str] = field(default_factory=lambda: {
        "INTELLECT_NODE_ADVERT_LIFETIME_S": "20", "INTELLECT_NODE_ADVERT_REFRESH_S": "5",
        "INTELLECT_NODE_HEARTBEAT_S": "2", "INTELLECT_NODE_DISCOVERY_S": "3",
    })
    nodes: dict[str, NodeProcess] = field(default_factory=dict)
    startup_timeout_s: float = STARTUP_TIMEOUT_S  # a node's address must be printed within this

    def start(self, name: str, args: list[str], extra_env: dict[str, str] | None = None, *,
              prefix: Sequence[str] = (), listen: str = "/ip4/127.0.0.1/tcp/0") -> NodeProcess:
        """Start one node and wait for the multiaddr it prints; RuntimeError with its log if it fails.

        ``prefix`` wraps the command (``ip netns exec NAME`` in tests/support/netns.py's namespaces)."""
        home = self.root / name
        home.mkdir(parents=True, exist_ok=True)
        log_file = open(home / "node.log", "a")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, **self.timing, **(extra_env or {}), "PYTHONUNBUFFERED": "1"}
        command = [*prefix, *_node_command([*args, "--home", str(home), "--run-id", self.run_id, "--listen", listen])]
        # a session of its own: Ctrl-C in the launcher's terminal is the launcher's to handle
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log_file, text=True, env=env,
                                   cwd=Path(__file__).resolve().parent.parent, start_new_session=True)
        node = NodeProcess(name, home, process, log_file=log_file)
        self.nodes[name] = node
        deadline = time.monotonic() + self.startup_timeout_s
        assert process.stdout is not None
        line = process.stdout.readline().strip()  # the first listen address, printed when ready
        if not line or time.monotonic() > deadline:
            self.stop(name)
            raise RuntimeError(f"node {name} did not start:\n{(home / 'node.log').read_text()[-3000:]}")
        node.addr = line
        return node

    def start_bootstrap(self, name: str = "bootstrap") -> NodeProcess:
        return self.start(name, ["bootstrap"])

    def start_member(self, name: str, role: str, bootstrap: Iterable[str]) -> NodeProcess:
        args = ["join", "--role", role]
        for addr in bootstrap:
            args += ["--bootstrap", addr]
        return self.start(name, args)

    def kill(self, name: str) -> None:
        """SIGKILL: the node gets no chance to say goodbye, as in a crash."""
        node = self.nodes.pop(name)
        node.process.kill()
        node.process.wait()
        if node.log_file:
            node.log_file.close()

    def stop(self, name: str, timeout_s: float = 15.0) -> int | None:
        """SIGTERM and wait; returns the exit code (None if it had to be killed)."""
        node = self.nodes.pop(name)
        node.process.send_signal(signal.SIGTERM)
        try:
            code: int | None = node.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            node.process.kill()
            node.process.wait()
            code = None
        if node.log_file:
            node.log_file.close()
        return code

    def stop_all(self) -> None:
        for name in list(self.nodes):
            self.stop(name)

    def wait_until(self, predicate: Any, timeout_s: float, poll_s: float = 0.25) -> float:
        """``wait_until`` for this swarm: a timeout names what each running node logged last, so a
        run that stalled (in CI, say) says where."""
        try:
            return wait_until(predicate, timeout_s, poll_s)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; the nodes' last log lines:\n{self.log_tails()}") from None

    def log_tails(self, lines: int = LOG_TAIL_LINES) -> str:
        """Each running node's warnings (the last ``lines`` of them: a ban, a failed step) and the
        last ``lines`` of its log. Why the warnings: a stall is often decided long before the tail
        (a CI failure showed two nodes resetting each other's streams, but not why)."""
        tails = []
        for name, node in self.nodes.items():
            try:
                log_lines = (node.home / "node.log").read_text(errors="replace").splitlines()
            except OSError as exc:
                log_lines = [f"(no log: {exc})"]
            tail = log_lines[-lines:]
            earlier = [line for line in log_lines[:-lines] if " WARNING " in line or " ERROR " in line][-lines:]
            tails.append("\n".join([f"--- {name}", *(["(warnings before the tail:)", *earlier, "(the tail:)"]
                                                      if earlier else []), *tail]))
        return "\n".join(tails)

    def converged(self, names: Iterable[str] | None = None) -> bool:
        """Every named node (default: all running) lists every named node as a member."""
        chosen = [self.nodes[n] for n in (names or list(self.nodes))]
        expected = {node.peer_id for node in chosen}
        return all(expected <= node.member_ids() for node in chosen)
