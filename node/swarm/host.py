"""The libp2p host: our Ed25519 identity, Noise as the only security transport, yamux.

A default py-libp2p host also accepts plaintext and secio dialers and prefers mplex (about 25 MiB/s
against yamux's 120 on loopback), so both choices are made explicitly here.
"""

from __future__ import annotations

import logging

import multiaddr
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.crypto.ed25519 import Ed25519PrivateKey
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux

from intellect_node.crypto.identity import Identity

log = logging.getLogger(__name__)


def build_host(identity: Identity) -> IHost:
    private = Ed25519PrivateKey.new(identity.seed)
    key_pair = KeyPair(private, private.get_public_key())
    noise = NoiseTransport(key_pair, noise_privkey=new_x25519_key_pair().private_key)
    return new_host(
        key_pair=key_pair,
        sec_opt={NOISE_PROTOCOL_ID: noise},
        muxer_opt={TProtocol(YAMUX_PROTOCOL_ID): Yamux},
    )


def parse_peer_addr(addr: str) -> PeerInfo:
    """A multiaddr that ends in /p2p/<peer id>; ValueError with the address otherwise."""
    try:
        return info_from_p2p_addr(multiaddr.Multiaddr(addr))
    except Exception as exc:  # multiaddr raises a zoo of types for bad input
        raise ValueError(f"not a peer multiaddr (expected .../p2p/<peer id>): {addr!r} ({exc})") from None


def quiet_libp2p_logs(verbose: bool) -> None:
    """libp2p logs routine events (a peer closing a DHT stream) at ERROR; show them only when asked."""
    logging.getLogger("libp2p").setLevel(logging.DEBUG if verbose else logging.CRITICAL)
