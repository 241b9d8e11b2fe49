"""The node's side of the averager child: start it, ask it to average, restart it, stop it.

Why the child is supervised here rather than by the node's service supervisor: a crashed child is
noticed at the next request (its process has exited or its socket closed), and the round in
progress fails cleanly either way; the client starts a fresh child before the next request.
The child leads its own process group, so ``close`` (and a crash of the node, through the child's
watchdog on its parent pid) ends hivemind's daemons with it. Every reply is checked against its schema:
the child is ours, but the bytes come from other peers' data through hivemind.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from intellect_node.crypto.identity import Identity
from intellect_node.node.diloco import frames, grid
from intellect_node.node.diloco.layout import Layout
from intellect_node.node.diloco.membership import sign_member

log = logging.getLogger(__name__)
START_TIMEOUT_S = 60.0
REPLY_MARGIN_S = 30.0


class AveragerError(Exception):
    """The child is unreachable, answered out of protocol, or the round could not be averaged."""


@dataclass(frozen=True)
class ChildSettings:
    """What ``init`` tells the child (specs/diloco.md section 6)."""

    prefix: str
    levels: int
    initial_peers: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 0
    max_peers: int = 64
    min_peers: int = 2
    matchmaking_s: float = 2.0
    identity_path: str = ""  # a key file keeps the hivemind peer id across restarts; "" draws a new one
    allowlist: tuple[str, ...] = ()  # node peer ids admitted to rounds; empty: anyone (specs/diloco.md section 8)
    data_digest: bytes = b""  # the data's content digest (PeerData.digest): members with another are refused
    sparse_k: int = 0  # values kept per chunk in a sparse run (compressions.SPARSE); 0: dense


@dataclass(frozen=True)
class Averaged:
    """One round's exact group result."""

    round: int
    group_size: int
    exponents: torch.Tensor  # int8, one per chunk: the group's shared grid
    sums: torch.Tensor  # int32, one per element
    peer_hashes: dict[str, bytes]
    seconds: float
    sent_bytes: int  # packed tensor bytes this member's averager sent since the last round's reply, framing excluded
    attempts: int  # all-reduce attempts this member began in the round (hivemind retries a failed one)


class AveragerClient:
    def __init__(self, socket_path: Path, layout: Layout, settings: ChildSettings,
                 log_path: Path | None = None) -> None:
        self.socket_path, self.layout, self.settings, self.log_path = socket_path, layout, settings, log_path
        # the "layout" members sign and compare: the run digest bound to the grid (compression)
        self.agreement = grid.agreement(layout.run_digest(settings.data_digest), settings.levels, settings.sparse_k)
        self.process: subprocess.Popen[bytes] | None = None
        self.conn: socket.socket | None = None
        self.restarts = -1  # the first start is not a restart
        self.peer_id = ""
        self.maddrs: list[str] = []
        self._busy = threading.Lock()  # one request at a time; close() from another thread does not wait for it
        self._life = threading.Lock()  # guards swapping out the connection and the process
        self.closed = threading.Event()  # set by close(): no child is started after it, whichever thread asks

    # --- life cycle -----------------------------------------------------------------------

    def ensure_running(self) -> None:
        """Start the child if it is not running (first use, or it died); AveragerError once closed, so a
        round thread racing the node's shutdown does not start a child nobody will stop."""
        if self.closed.is_set():
            raise AveragerError("the averager client is closed")
        if self.process is not None and self.process.poll() is None and self.conn is not None:
            return
        self._stop_process()
        self.restarts += 1
        self.socket_path.unlink(missing_ok=True)
        output = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            process = self.process = subprocess.Popen(
                [sys.executable, "-m", "intellect_node.node.diloco.averager_child", "--socket", str(self.socket_path),
                 "--parent-pid", str(os.getpid())], stdout=output, stderr=output, stdin=subprocess.DEVNULL,
                start_new_session=True)
        finally:
            if output is not subprocess.DEVNULL:
                output.close()
        try:
            self.conn = self._connect()
            self.peer_id, self.maddrs = self._init()
        except AveragerError:  # a child that never became ready (or was closed meanwhile) is ended here
            self._stop_process()
            raise
        log.info("averager child %d ready as %s (%d restarts)", process.pid, self.peer_id, self.restarts)

    def _init(self) -> tuple[str, list[str]]:
        """The child's first request (its hivemind settings); its hivemind peer id and multiaddrs."""
        reply = self._ask({"type": "init", "prefix": self.settings.prefix,
                           "shapes": [list(s) for s in self.layout.shapes],
                           "layout": self.agreement,
                           "levels": self.settings.levels, "sparse_k": self.settings.sparse_k,
                           "initial_peers": list(self.settings.initial_peers),
                           "host": self.settings.host, "port": self.settings.port, "max_peers": self.settings.max_peers,
                           "min_peers": self.settings.min_peers, "matchmaking_s": self.settings.matchmaking_s,
                           "identity_path": self.settings.identity_path, "allowlist": list(self.settings.allowlist)},
                          START_TIMEOUT_S, {"ready": frames.READY})
        return reply["peer_id"], reply["maddrs"]

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            process = self.process  # None once close() from another thread ended it
            if process is None or self.closed.is_set():
                raise AveragerError("the averager client was closed while its child started")
            if process.poll() is not None:
                raise AveragerError(f"the averager child exited with {process.returncode} before listening")
            try:
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conn.connect(str(self.socket_path))
                return conn
            except (FileNotFoundError, ConnectionRefusedError):
                conn.close()
                time.sleep(0.1)
        raise AveragerError(f"the averager child did not listen on {self.socket_path} within {START_TIMEOUT_S:g} s")

    def close(self) -> None:
        """End the child for good: no request after this starts another (a node shutting down)."""
        self.closed.set()
        self._end_child()

    def restart(self, settings: ChildSettings) -> None:
        """End the child and start one with ``settings`` (other initial peers: a swarm started apart)."""
        self._end_child()
        self.settings = settings
        self.ensure_running()

    def _end_child(self) -> None:
        """Ask the child to stop (unless a request is in flight: that one fails at once), then end
        its whole process group, so no hivemind daemon survives. At most about 4 s: a node's
        SIGTERM must end it well within a supervisor's patience."""
        graceful = self._busy.acquire(blocking=False)
        try:
            if graceful and self.conn is not None and self.process is not None and self.process.poll() is None:
                try:
                    self._exchange({"type": "shutdown"}, 2.0, {"bye": {}})
                except AveragerError:
                    graceful = False
        finally:
            if graceful:
                self._busy.release()
        self._stop_process(grace_s=2.0 if graceful else 0.0)

    def _stop_process(self, grace_s: float = 0.0) -> None:
        """Close the connection and end the child's group; safe from two threads at once (``close``
        from the node while a request in flight fails on the closed connection)."""
        with self._life:
            conn, self.conn = self.conn, None
            process, self.process = self.process, None
        if conn is not None:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked on a reply
            except OSError:
                pass
            conn.close()
        if process is None:
            return
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(process.pid, signal.SIGKILL)  # the child leads its group: hivemind's daemons too
        except ProcessLookupError:
            pass
        process.wait()

    # --- requests -------------------------------------------------------------------------

    def _ask(self, message: dict[str, Any], timeout_s: float, replies: dict[str, dict[str, Any]]) -> dict[str, Any]:
        with self._busy:
            return self._exchange(message, timeout_s, replies)

    def _exchange(self, message: dict[str, Any], timeout_s: float,
                  replies: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """One request and its checked reply; a broken connection drops the child (restarted on next use)."""
        conn = self.conn
        if conn is None:
            raise AveragerError("the averager child is not running")
        try:
            conn.settimeout(timeout_s)
            frames.send(conn, message)
            reply = frames.receive(conn, frames.payload_limit(self.layout.elements))
            if reply["type"] == "error":
                raise AveragerError(f"the averager child refused {message['type']}: "
                                    f"{frames.validate(reply, frames.ERROR)['error']}")
            if reply["type"] not in replies:
                raise frames.FrameError(f"unexpected reply {reply['type'][:40]!r} to {message['type']}")
            return {"type": reply["type"]} | frames.validate(reply, replies[reply["type"]])
        except (OSError, EOFError, frames.FrameError) as exc:
            self._stop_process()
            raise AveragerError(f"averager child: {type(exc).__name__}: {exc}") from None

    def status(self) -> dict[str, Any]:
        self.ensure_running()
        return self._ask({"type": "status"}, 10.0, {"status": frames.STATUS_REPLY})

    def average(self, round_: int, values: torch.Tensor, state_hash: bytes, timeout_s: float,
                identity: Identity) -> Averaged:
        """The group's exact result for ``values`` (this member's x), or AveragerError. ``identity``
        (the node's key) signs this member into the round (``membership``)."""
        self.ensure_running()
        data = _le_bytes(values)
        signature = sign_member(identity, round_, self.peer_id, self.agreement, state_hash)
        reply = self._ask({"type": "average", "round": round_, "timeout_s": timeout_s, "state_hash": state_hash,
                           "values": data, "member": identity.peer_id, "signature": signature},
                          timeout_s + REPLY_MARGIN_S,
                          {"averaged": frames.averaged_reply(self.layout.elements, self.layout.chunks),
                           "failed": frames.FAILED})
        if reply["round"] != round_:
            raise AveragerError(f"the child answered for round {reply['round']}, asked {round_}")
        if reply["type"] == "failed":
            raise AveragerError(f"round {round_} not averaged: {reply['error']}")
        return Averaged(round_, reply["group_size"], torch.frombuffer(bytearray(reply["exponents"]), dtype=torch.int8),
                        torch.frombuffer(bytearray(reply["sums"]), dtype=torch.int32), reply["peer_hashes"],
                        reply["seconds"], reply["sent_bytes"], reply["attempts"])


def _le_bytes(t: torch.Tensor) -> bytes:
    return t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
