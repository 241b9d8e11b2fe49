"""The local control socket: ``intellect-node status`` asks a running node for its view.

A unix socket in the node's home (mode 0600 via the home's permissions), one JSON request line in,
one JSON document out. Local only, so it needs no authentication beyond file permissions.

Local is not trusted to behave: a client that sends 16 MiB, stalls, or leaves before its reply
(Ctrl-C on ``intellect-node status``) used to raise out of the server's nursery and end the node.
Each connection is guarded: the request is read up to ``MAX_REQUEST`` bytes (the limit is checked
before reading more), within ``READ_TIMEOUT_S``; at most ``MAX_CLIENTS`` are held at once (more
are closed unanswered at once, so a flood of idle clients delays an honest one by at most the read
timeout); and any error of one connection ends only that connection.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

log = logging.getLogger(__name__)
MAX_REQUEST = 1024
READ_TIMEOUT_S = 2.0  # a local client writes its one line at once
WRITE_TIMEOUT_S = 10.0
MAX_CLIENTS = 64  # a few KiB each while they wait; beyond it, connections are closed at once


class NodeAlreadyRunning(Exception):
    pass


def query(path: Path, command: str = "status", timeout_s: float = 5.0) -> dict[str, Any]:
    """Blocking client (the CLI needs no event loop for this); OSError when no node answers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(path))
        sock.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return json.loads(b"".join(chunks))


def claim_socket_path(path: Path) -> None:
    """Remove a stale socket left by a killed node; refuse if a live node still answers on it."""
    if not path.exists():
        return
    try:
        query(path, "ping", timeout_s=1.0)
    except OSError:
        path.unlink(missing_ok=True)
        return
    raise NodeAlreadyRunning(f"a node is already running with home {path.parent}")


async def serve_control(path: Path, snapshot: Callable[[], dict[str, Any]],
                        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    claim_socket_path(path)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind(str(path))
    os.chmod(path, 0o600)
    sock.listen(MAX_CLIENTS)
    listener = trio.SocketListener(sock)

    clients = trio.CapacityLimiter(MAX_CLIENTS)

    async def handle(stream: trio.SocketStream) -> None:
        try:
            async with stream:
                try:
                    clients.acquire_nowait()
                except trio.WouldBlock:
                    log.info("control socket: %d clients already served, closing another", MAX_CLIENTS)
                    return
                try:
                    await _answer(stream, snapshot)
                finally:
                    clients.release()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.debug("control client left: %r", exc)  # its loss; the node carries on
        except Exception:
            log.exception("control socket: a request failed")

    try:
        task_status.started()
        await trio.serve_listeners(handle, [listener])
    finally:  # one unlink, kept synchronous: an await here would be cancelled before removing the socket
        path.unlink(missing_ok=True)  # noqa: ASYNC240


async def read_request(stream: trio.SocketStream) -> bytes | None:
    """The request line (without its newline), or None when it is longer than MAX_REQUEST or does
    not arrive within READ_TIMEOUT_S; never reads more than MAX_REQUEST + 1 bytes."""
    buffer = b""
    with trio.move_on_after(READ_TIMEOUT_S):
        while len(buffer) <= MAX_REQUEST:
            chunk = await stream.receive_some(MAX_REQUEST + 1 - len(buffer))
            if not chunk:  # the client closed its side: what came is the request
                return buffer.strip()
            buffer += chunk
            if b"\n" in buffer:
                return buffer.split(b"\n", 1)[0].strip()
        return None
    return None


async def _answer(stream: trio.SocketStream, snapshot: Callable[[], dict[str, Any]]) -> None:
    request = await read_request(stream)
    if request is None:
        error = f"request over {MAX_REQUEST} bytes or slower than {READ_TIMEOUT_S:g} s"
        reply: dict[str, Any] = {"ok": False, "error": error}
    else:
        reply = {"ok": True} if request == b"ping" else snapshot()
    with trio.move_on_after(WRITE_TIMEOUT_S):
        await stream.send_all(json.dumps(reply).encode())
