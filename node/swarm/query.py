"""Ask the swarm for its members without joining it: what ``status`` does when no local node runs.

An ephemeral identity (nothing written to disk), a connection to the first reachable peer, one
read-only members request (no advert and an empty digest: every advert the peer holds), and every
advert in the answer verified like any other network input.
"""

from __future__ import annotations

import time
from typing import Any

import multiaddr
import trio
from libp2p.custom_types import TProtocol

from intellect_node.crypto.identity import Identity
from intellect_node.node.swarm.host import build_host, parse_peer_addr
from intellect_node.node.swarm.membership import MemberView, member_summary
from intellect_node.node.swarm.streams import read_frame, write_frame
from intellect_node.protocol.errors import Rejected
from intellect_node.protocol.framing import (
    MAX_MEMBERS_RESPONSE,
    MEMBERS_PROTOCOL,
    decode_envelope_list,
    encode_members_request,
)


async def query_members(candidates: list[str], run_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """Members known to the first candidate that answers; ConnectionError when none does."""
    identity = Identity.generate()
    host = build_host(identity)
    errors: list[str] = []
    async with host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        for addr in candidates:
            with trio.move_on_after(timeout_s):
                try:
                    info = parse_peer_addr(addr)
                    host.get_peerstore().add_addrs(info.peer_id, info.addrs, 600)
                    await host.connect(info)
                    stream = await host.new_stream(info.peer_id, [TProtocol(MEMBERS_PROTOCOL)])
                    await write_frame(stream, encode_members_request(b"", []))
                    envelopes = decode_envelope_list(await read_frame(stream, MAX_MEMBERS_RESPONSE, timeout_s))
                    await stream.close()
                except Exception as exc:  # transport errors come in many types: report, try the next
                    errors.append(f"{addr}: {exc}")
                    continue
                view = MemberView(run_id)
                rejected = 0
                for envelope in envelopes:
                    try:
                        view.accept(envelope)
                    except Rejected:
                        rejected += 1
                now = time.time()
                return {
                    "source": addr,
                    "run_id": run_id,
                    "members": [member_summary(m, now) for m in view.members()],
                    "rejected_adverts": rejected,
                }
            errors.append(f"{addr}: timed out")
    raise ConnectionError("no peer answered: " + "; ".join(errors) if errors else "no peers to ask")
