"""The local control socket: ``intellect-node status`` asks a running node for its view.

A unix socket in the node's home (mode 0600 via the home's permissions), one JSON request line in,
one JSON document out. Local only, so it needs no authentication beyond file permissions.
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


def _claim_socket_path(path: Path) -> None:
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
    _claim_socket_path(path)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind(str(path))
    os.chmod(path, 0o600)
    sock.listen(16)
    listener = trio.SocketListener(sock)

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            with trio.move_on_after(5):
                request = (await stream.receive_some(MAX_REQUEST)).strip()
                reply = {"ok": True} if request == b"ping" else snapshot()
                await stream.send_all(json.dumps(reply).encode())

    try:
        task_status.started()
        await trio.serve_listeners(handle, [listener])
    finally:
        path.unlink(missing_ok=True)
