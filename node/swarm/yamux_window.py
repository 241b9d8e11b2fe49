"""Yamux receive credit returned the go-yamux way: one WINDOW_UPDATE once half the window is read.

py-libp2p 0.8.1 sends a WINDOW_UPDATE after every read of a stream (its ``RELEASE_ON_READ`` and
"partial slack" paths), so every small gossip message a node received cost it a second frame
back, encrypted and written: in a 100-node swarm at rest, a tenth of a light member's CPU (py-spy
of three members, bench/HISTORY.md "Scale"). go-yamux (``sendWindowUpdate``) returns credit only
once the consumed part reaches half the window, and so does this. Flow control is unchanged: a
sender still stops at a full window, and credit comes back while it still has half of one.
The window's auto-tuning (py-libp2p's ``_apply_autotune_epoch``) is kept as it is.

Installed on py-libp2p's ``YamuxStream`` class (libp2p is pinned to 0.8.1 in pyproject.toml):
the node's host builds its yamux streams there, and no other code in the process does.
"""

from __future__ import annotations

from libp2p.stream_muxer.yamux.yamux import YamuxStream

# the consumed share of the window that earns an update (go-yamux: half)
UPDATE_AT_SHARE = 0.5


async def return_credit_in_halves(self: YamuxStream, *, bytes_read: int = 0) -> None:
    """After a read: a WINDOW_UPDATE for everything consumed since the last one, once that is at
    least half the target window (``bytes_read`` is implied by the window's own accounting)."""
    del bytes_read  # the window's accounting already holds it
    async with self.window_lock:
        buffered = len(self.conn.stream_buffers.get(self.stream_id, b""))
        consumed = self.target_recv_window - (self.recv_window + buffered)
        if consumed <= 0 or consumed < UPDATE_AT_SHARE * self.target_recv_window:
            return
        self.recv_window += consumed
        self._pending_recv_release = 0
        increment = consumed + self._apply_autotune_epoch(buffered)
    # never under window_lock: an inbound WINDOW_UPDATE handler takes it to adjust the send window
    await self.send_window_update(increment, skip_lock=True)


def install() -> None:
    YamuxStream._auto_tune_and_send_window_update = return_credit_in_halves  # type: ignore[method-assign]
