"""An attacker's libp2p peer: its own key and host, and raw writes on a node's members stream."""

from libp2p.custom_types import TProtocol

from intellect_node.crypto.identity import Identity
from intellect_node.node.swarm.host import build_host, parse_peer_addr
from intellect_node.node.swarm.streams import read_frame
from intellect_node.protocol import codec
from intellect_node.protocol.framing import MEMBERS_PROTOCOL, encode_members_request, frame
from tests.support.protocol_samples import sample_advert


class Attacker:
    """A fresh key on its own libp2p host, aimed at one node of run ``run_id``."""

    def __init__(self, target_addr: str, run_id: str) -> None:
        self.identity, self.run_id = Identity.generate(), run_id
        self.host = build_host(self.identity)
        self.target = parse_peer_addr(target_addr)

    def advert(self, **changes) -> bytes:
        return codec.encode(sample_advert(self.identity, run_id=self.run_id, **changes), self.identity, lifetime_s=60)

    @staticmethod
    def members_request(advert: bytes, digests: list[bytes] | None = None) -> bytes:
        """A well-formed members request frame around ``advert`` (whatever bytes it holds)."""
        return frame(encode_members_request(advert, digests or []))

    async def send_members_request(self, raw: bytes) -> bytes | None:
        """Write raw bytes on a members stream; the target's reply payload, or None if it hung up."""
        self.host.get_peerstore().add_addrs(self.target.peer_id, self.target.addrs, 600)
        await self.host.connect(self.target)
        stream = await self.host.new_stream(self.target.peer_id, [TProtocol(MEMBERS_PROTOCOL)])
        await stream.write(raw)
        try:
            return await read_frame(stream, 1 << 20, 8.0)
        except Exception:
            return None
