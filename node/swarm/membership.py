"""The run's member list: verified adverts from the DHT, from gossip heartbeats and from peers.

Kademlia cannot enumerate keys and provider records return only the closest ~20 providers, so the
list has three sources, all checked the same way (``MemberView.accept``):
- every node repeats its signed advert on the run's members topic (gossip heartbeat);
- a node that connects asks the peer for the adverts it lacks (``/ina/members/2.0.0``);
- provider records on the run key, then a DHT get of each provider's advert.
The signed advert is the source of truth in each case; its expiry removes nodes that vanish.

Identities are free, so the table is bounded (issue 21: 500 sybil adverts pushed a node's members
response past its own 1 MiB frame limit and blinded every peer that asked it). At most
``MAX_PER_IP`` members per advertised IP, ``MAX_PER_SUBNET`` per IPv4 /24 and ``MAX_MEMBERS`` in
all; when a bucket is full the least proven member goes first, and a newcomer never outranks a
member with proven work (``vouch``) or one seen for longer, so a flood cannot push out the members
already known. The members response is ranked the same way and cut to fit its frame; it leaves
out what the asking peer holds already (the digests of its request, specs/wire.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import cached_property
from typing import Any

from libp2p.records.validator import Validator

from intellect_node.crypto.envelope import now_ms
from intellect_node.node.swarm.peer_scores import PeerScores
from intellect_node.protocol import codec
from intellect_node.protocol.errors import InvalidValue, Rejected, Replayed
from intellect_node.protocol.framing import MAX_MEMBERS_PER_RESPONSE, MAX_MEMBERS_RESPONSE, envelope_digest
from intellect_node.protocol.keys import advert_key
from intellect_node.protocol.messages import NodeAdvert


@dataclass(frozen=True)
class Member:
    advert: NodeAdvert
    envelope: bytes
    timestamp_ms: int
    expiry_ms: int
    received_ms: int
    first_seen_ms: int  # when this view first held the peer: uptime as far as we can tell

    @cached_property
    def digest(self) -> bytes:
        """What stands for this envelope in a members request: hashed once, not per pull served."""
        return envelope_digest(self.envelope)


MAX_MEMBERS = 1024
MAX_PER_IP = 64  # several honest nodes share an IP behind NAT or on one test machine
MAX_PER_SUBNET = 128
ENTRY_OVERHEAD = 5  # msgpack bin 32 header per envelope in the members response
LIST_OVERHEAD = 5


class TableFull(Rejected):
    """A new member that does not outrank anyone in its full bucket; relayed honestly, so free."""

    reason = "member_table_full"


def advertised_ip(advert: NodeAdvert) -> str:
    """The first IP an advert names ("" for none): a claim, but one a sybil flood must spread out."""
    for addr in advert.addrs:
        parts = addr.split("/")
        if len(parts) > 2 and parts[1] in ("ip4", "ip6"):
            return parts[2]
    return ""


def subnet(ip: str) -> str:
    return ip.rsplit(".", 1)[0] if ip.count(".") == 3 else ip


class MemberView:
    """Verified, unexpired adverts of one run, newest per peer, bounded per IP, /24 and in all."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._members: dict[str, Member] = {}
        self._envelopes: dict[bytes, int] = {}  # held envelope -> its expiry: a repeat costs no decoding
        self._proven: set[str] = set()

    def vouch(self, peer_id: str) -> None:
        """``peer_id`` did work this node accepted (a stored batch, a verified checkpoint): keep it."""
        self._proven.add(peer_id)

    def _rank(self, member: Member) -> tuple[bool, int]:
        """Higher is kept longer and listed first: proven work, then the longest seen."""
        return member.advert.peer_id in self._proven, -member.first_seen_ms

    def _make_room(self, newcomer: Member) -> None:
        """Evict the least proven member of each full bucket the newcomer falls in; TableFull when
        the newcomer itself is the least proven of one."""
        ip = advertised_ip(newcomer.advert)
        buckets = [(lambda m: True, MAX_MEMBERS),
                   (lambda m: advertised_ip(m.advert) == ip, MAX_PER_IP),
                   (lambda m: subnet(advertised_ip(m.advert)) == subnet(ip), MAX_PER_SUBNET)]
        for inside, cap in buckets:
            held = [m for m in self._members.values() if inside(m)]
            if len(held) < cap:
                continue
            weakest = min(held, key=self._rank)
            if self._rank(weakest) >= self._rank(newcomer):
                raise TableFull(f"member table full ({cap} in the bucket of {ip or 'no address'})")
            self._drop(weakest.advert.peer_id)

    def accept(self, data: bytes, now: int | None = None) -> Member | None:
        """Verify an advert envelope and record it; None for a copy of what is already known.

        Raises ``Rejected`` for anything invalid, for another run's advert, and for an advert older
        than the one held (a replay: it could resurrect a node that has left, or roll back its step).
        """
        now = now_ms() if now is None else now
        if self._envelopes.get(data, 0) > now:  # the same bytes again (every pull repeats them): no decoding
            return None
        signed = codec.decode(data, NodeAdvert, now_ms=now)
        advert = signed.message
        if advert.run_id != self.run_id:
            raise InvalidValue(f"advert for run {advert.run_id!r}, this node is in {self.run_id!r}")
        held = self._members.get(advert.peer_id)
        if held is not None:
            if signed.envelope.timestamp_ms <= held.timestamp_ms:
                raise Replayed("advert is not newer than the one held for that peer")
        member = Member(advert, data, signed.envelope.timestamp_ms, signed.envelope.expiry_ms, now, now)
        if held is not None:
            member = replace(member, first_seen_ms=held.first_seen_ms)
        else:
            self._make_room(member)
        if held is not None:
            self._envelopes.pop(held.envelope, None)
        self._members[advert.peer_id] = member
        self._envelopes[data] = member.expiry_ms
        return member

    def _drop(self, peer_id: str) -> None:
        self._envelopes.pop(self._members.pop(peer_id).envelope, None)

    def prune(self, now: int | None = None) -> list[str]:
        """Drop expired adverts; returns the peer ids dropped."""
        now = now_ms() if now is None else now
        gone = [peer for peer, member in self._members.items() if member.expiry_ms <= now]
        for peer in gone:
            self._drop(peer)
        return gone

    def members(self, now: int | None = None) -> list[Member]:
        now = now_ms() if now is None else now
        return [m for m in self._members.values() if m.expiry_ms > now]

    def get(self, peer_id: str) -> Member | None:
        return self._members.get(peer_id)

    def envelopes(self, budget: int = MAX_MEMBERS_RESPONSE, held: frozenset[bytes] = frozenset()) -> list[bytes]:
        """The members' envelopes but those whose digest is in ``held`` (what the asking peer has),
        most proven and longest seen first, as many as fit ``budget`` bytes once msgpack-encoded
        (and at most MAX_MEMBERS_PER_RESPONSE)."""
        chosen, size = [], LIST_OVERHEAD
        lacking = (m for m in sorted(self.members(), key=self._rank, reverse=True) if m.digest not in held)
        for member in lacking:
            size += len(member.envelope) + ENTRY_OVERHEAD
            if size > budget or len(chosen) == MAX_MEMBERS_PER_RESPONSE:
                break
            chosen.append(member.envelope)
        return chosen

    def digests(self) -> list[bytes]:
        """The digest of every advert held: sent with a pull, so the peer answers only the rest."""
        return [member.digest for member in self.members()]


def member_summary(member: Member, now_s: float) -> dict[str, Any]:
    """The JSON-ready view of a member that ``status`` prints."""
    advert = member.advert
    return {
        "peer_id": advert.peer_id,
        "roles": list(advert.roles),
        "hardware": asdict(advert.hardware),
        "policy_step": advert.policy_step,
        "software_version": advert.software_version,
        "throughput_tokens_per_s": advert.throughput_tokens_per_s,
        "addrs": list(advert.addrs),
        "age_s": round(now_s - member.timestamp_ms / 1000, 1),
        "expires_in_s": round(member.expiry_ms / 1000 - now_s, 1),
    }


def check_advert_record(key: str, value: bytes) -> codec.Signed[NodeAdvert]:
    """A DHT value under ``key``, verified: a valid advert stored under its own key; else ``Rejected``.

    The one check for every advert read from or stored in the DHT (the validator below, and
    ``intellect_node.node.swarm.dht_get``), so a forged, expired or misplaced advert is refused the same way everywhere.
    """
    signed = codec.decode(value, NodeAdvert)
    if advert_key(signed.message.run_id, signed.message.peer_id) != key:
        raise InvalidValue("advert stored under a key that is not its own")
    return signed


class AdvertRecordValidator(Validator):
    """DHT validator for "/ina/..." keys: a value must be a valid advert stored under its own key.

    libp2p runs it when this node stores a value (its own or a remote put) and when it selects
    among values fetched from several peers, so forged, expired or misplaced adverts never enter
    this node's store. Remote puts carry no sender here, so rejections are counted, not charged.
    """

    def __init__(self, scores: PeerScores) -> None:
        self.scores = scores

    def validate(self, key: str, value: bytes) -> None:
        try:
            check_advert_record(key, value)
        except Rejected as exc:
            self.scores.reject(None, exc.reason, f"DHT value for {key}: {exc}")
            raise ValueError(f"{exc.reason}: {exc}") from None

    def select(self, key: str, values: list[bytes]) -> int:
        """The newest valid advert; index 0 when none is valid (libp2p then validates it and fails)."""
        best, best_ts = 0, -1
        for index, value in enumerate(values):
            try:
                timestamp = check_advert_record(key, value).envelope.timestamp_ms
            except Rejected:
                continue
            if timestamp > best_ts:
                best, best_ts = index, timestamp
        return best
