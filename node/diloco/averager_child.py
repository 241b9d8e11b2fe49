"""The averager child: hivemind's DHT and our ``ExactAverager``, serving its parent over a unix
socket (specs/diloco.md section 6). Run as
``python -m intellect_node.node.diloco.averager_child --socket PATH --parent-pid PID``.

Why a process of its own: hivemind and py-libp2p both register the protobuf symbol
``crypto.pb.KeyType`` and cannot be imported into one process; this module imports nothing that
imports libp2p (``status`` reports it). It dies with its parent (a watchdog on the parent pid). \
Each connection is read in its own thread, so a bad client gets an ``error``
frame and a closed connection while the parent's connection goes on; the main thread answers
every request in turn (hivemind installs signal handlers, which only the main thread may do).
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import hivemind
import torch

from intellect_node.node.diloco import frames, grid
from intellect_node.node.diloco.exact_averager import ExactAverager, round_bits
from intellect_node.node.diloco.layout import Layout

log = logging.getLogger("diloco.averager_child")
WATCHDOG_S = 1.0


class Child:
    """The child's state: nothing until ``init``, then the DHT and the averager."""

    def __init__(self) -> None:
        self.layout: Layout | None = None
        self.levels = 0
        self.dht: Any = None
        self.averager: Any = None
        self.rounds = 0
        self.sent_reported = 0
        self.attempts_reported = 0
        self.stop = threading.Event()

    @property
    def limit(self) -> int:
        return frames.PRE_INIT_LIMIT if self.layout is None else frames.payload_limit(self.layout.elements)

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        kind = message["type"]
        if kind == "init":
            return self.init(frames.validate(message, frames.INIT))
        if kind == "status":
            frames.validate(message, {})
            return {"type": "status", "peer_id": self.peer_id(), "maddrs": self.maddrs(), "rounds": self.rounds,
                    "libp2p_loaded": "libp2p" in sys.modules,
                    "refused_parts": self.averager.refused_parts.value if self.averager is not None else 0,
                    "refused_replies": self.averager.refused_replies.value if self.averager is not None else 0}
        if kind == "shutdown":
            frames.validate(message, {})
            self.stop.set()
            return {"type": "bye"}
        if kind == "average":
            if self.layout is None:
                raise frames.FrameError("average before init")
            return self.average(frames.validate(message, frames.average_request(self.layout.elements)))
        raise frames.FrameError(f"unknown message type {kind[:40]!r}")

    def peer_id(self) -> str:
        return str(self.dht.peer_id) if self.dht is not None else ""

    def maddrs(self) -> list[str]:
        return [str(m) for m in self.dht.get_visible_maddrs()] if self.dht is not None else []

    def init(self, m: dict[str, Any]) -> dict[str, Any]:
        if self.layout is not None:
            raise frames.FrameError("init twice")
        shapes = m["shapes"]
        # the parent's names stay with the parent: the child needs the sizes, and the layout hash
        # (names included) that members compare and sign
        layout = Layout(tuple(f"t{i:05d}" for i in range(len(shapes))), tuple(shapes))
        if m["min_peers"] > m["max_peers"]:
            raise frames.FrameError("min_peers is over max_peers")
        self.dht = hivemind.DHT(initial_peers=m["initial_peers"], host_maddrs=[f"/ip4/{m['host']}/tcp/{m['port']}"],
                                identity_path=m["identity_path"] or None, start=True)
        self.averager = ExactAverager(layout, m["layout"], m["levels"], frozenset(m["allowlist"]), m["sparse_k"],
                                      dht=self.dht,
                                      start=True, prefix=m["prefix"],
                                      target_group_size=m["max_peers"], min_group_size=m["min_peers"],
                                      min_matchmaking_time=m["matchmaking_s"], request_timeout=3.0,
                                      next_chunk_timeout=5.0, allreduce_timeout=30.0)
        self.layout, self.levels = layout, m["levels"]
        return {"type": "ready", "peer_id": self.peer_id(), "maddrs": self.maddrs()}

    def average(self, m: dict[str, Any]) -> dict[str, Any]:
        assert self.layout is not None
        started = time.monotonic()
        values = torch.frombuffer(bytearray(m["values"]), dtype=torch.float32)
        try:
            exponents = grid.exponents(values, self.levels)
        except ValueError as exc:
            return {"type": "failed", "round": m["round"], "error": str(exc)}
        self.averager.raw.copy_(values)
        self.averager.set_group_bits(round_bits(m["round"]))
        payload = {"round": m["round"], "layout": self.averager.layout_digest, "state_hash": m["state_hash"],
                   "exponents": exponents.numpy().tobytes(), "member": m["member"], "signature": m["signature"]}
        try:
            control = self.averager.step(gather=payload, timeout=m["timeout_s"], allow_retries=True, wait=False)
        except Exception as exc:  # hivemind refused the request itself (e.g. a timeout shorter than matchmaking)
            return {"type": "failed", "round": m["round"], "error": f"{type(exc).__name__}: {exc}"[:2000]}
        try:
            gathered = control.result(timeout=m["timeout_s"] + 5.0)
        except Exception as exc:  # hivemind's failures: no group, all-reduce failed on every retry, timeout
            control.cancel()
            return {"type": "failed", "round": m["round"], "error": f"{type(exc).__name__}: {exc}"[:2000]}
        if not gathered:
            return {"type": "failed", "round": m["round"], "error": "no group formed within the round timeout"}
        group = len(gathered)
        shared = grid.shared_exponents([torch.frombuffer(bytearray(p["exponents"]), dtype=torch.int8)
                                        for p in gathered.values()])
        with self.averager.get_tensors() as tensors:
            sums = grid.recover_sums(tensors[0], group)
        self.rounds += 1
        return {"type": "averaged", "round": m["round"], "group_size": group, "exponents": shared.numpy().tobytes(),
                "sums": sums.numpy().astype("<i4").tobytes(),
                "peer_hashes": {str(peer): p["state_hash"] for peer, p in gathered.items()},
                "seconds": time.monotonic() - started, "sent_bytes": self._sent_since_last_reply(),
                "attempts": self._attempts_since_last_reply()}

    def _sent_since_last_reply(self) -> int:
        """Packed bytes sent since the last reply: a reducer may still be streaming replies to others
        when its own step completes, so those bytes land in the next round's figure, never lost."""
        total = self.averager.sent.value
        sent, self.sent_reported = total - self.sent_reported, total
        return sent

    def _attempts_since_last_reply(self) -> int:
        """All-reduce attempts begun in this round's step: a retried attempt sends its bytes again."""
        total = self.averager.attempts.value
        attempts, self.attempts_reported = total - self.attempts_reported, total
        return attempts

    def close(self) -> None:
        for part in (self.averager, self.dht):
            if part is not None:
                part.shutdown()


Request = tuple[dict[str, Any], "queue.Queue[dict[str, Any] | Exception]"]


def serve_connection(child: Child, conn: socket.socket, requests: queue.Queue[Request]) -> None:
    """Read requests until the client closes; the main thread answers them (hivemind must be
    started there). A broken frame gets an ``error`` reply and the connection closed."""
    with conn:
        while not child.stop.is_set():
            try:
                message = frames.receive(conn, child.limit)
                answer: queue.Queue[dict[str, Any] | Exception] = queue.Queue(maxsize=1)
                requests.put((message, answer))
                reply = answer.get()
                if isinstance(reply, Exception):
                    raise reply
                frames.send(conn, reply)
            except (EOFError, OSError):
                return
            except frames.FrameError as exc:
                log.warning("refused a frame: %s", exc)
                try:
                    frames.send(conn, {"type": "error", "error": str(exc)[:2000]})
                except OSError:
                    pass
                return


def accept_forever(server: socket.socket, child: Child, requests: queue.Queue[Request]) -> None:
    while not child.stop.is_set():
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        conn.settimeout(None)
        threading.Thread(target=serve_connection, args=(child, conn, requests), daemon=True).start()


def _end_group(*_: Any) -> None:
    """End this child and every hivemind process it started (it leads its own process group)."""
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(3)


def _die_with_parent(parent_pid: int) -> None:
    """SIGTERM, or the parent process gone (polled), ends the child's group. Not PR_SET_PDEATHSIG:
    it fires when the parent *thread* that started the child exits, and the node starts children
    from worker threads that come and go."""
    signal.signal(signal.SIGTERM, _end_group)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(WATCHDOG_S)
        _end_group()

    threading.Thread(target=watch, daemon=True, name="parent-watchdog").start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s averager_child %(levelname)s %(message)s")
    _die_with_parent(args.parent_pid)
    args.socket.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        server.bind(str(args.socket))
    finally:
        os.umask(old)
    server.listen(4)
    server.settimeout(0.5)
    child = Child()
    requests: queue.Queue[Request] = queue.Queue()
    threading.Thread(target=accept_forever, args=(server, child, requests), daemon=True).start()
    try:
        while not child.stop.is_set():
            try:
                message, answer = requests.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                answer.put(child.handle(message))
            except frames.FrameError as exc:
                answer.put(exc)
            except Exception as exc:  # hivemind failed under a valid request: say so, keep serving
                log.exception("request %s failed", message.get("type"))
                answer.put(frames.FrameError(f"{message.get('type')} failed: {type(exc).__name__}: {exc}"[:2000]))
    finally:
        server.close()
        args.socket.unlink(missing_ok=True)
        child.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
