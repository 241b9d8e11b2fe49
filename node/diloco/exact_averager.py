"""hivemind's ``DecentralizedAverager``, made exact and all-or-nothing for DiLoCo rounds.

Runs inside the averager child only (it imports hivemind). Its changes, each for
specs/diloco.md sections 2 and 4:

- Before the all-reduce, every member's gather payload is checked (round, layout, exponents) and
  this member's contribution is quantized onto the group's shared grid, from the raw values the
  child left in shared memory. A retry quantizes again from the same raw values.
- After the all-reduce, a part that a failed peer was to reduce (hivemind silently keeps the local
  values) or a banned sender (a part averaged over fewer peers) makes the attempt an error, so
  hivemind matches again with the survivors instead of handing back a mixed result.
- An attempt is applied only when every member posted that its side completed (``commit``):
  hivemind's all-reduce can complete on a slow member while its groupmates time out on it.
- What comes back is checked too: the sums recovered from each reducer's replies must be sums of
  ``n`` honest contributions (``grid.sums_error``), or that reducer lied about the average, is
  counted, never grouped with again and the attempt fails; and every member posts digests of the
  group it saw (members in order, shared exponents) and of each reducer's span in the commit, so a
  leader that relayed different payloads, or a reducer that told members different sums, fails the
  attempt everywhere instead of splitting the group's state.
- The group key is the round (``RoundKeys``): hivemind's Moshpit reshuffle of the key after each
  group would send survivors of a failed attempt to different keys.
- The parts and deltas travel packed (``GridWire``, ``packing``): int8 up and scaled int16 down
  for the int8 and int4 grids, exactly, instead of fp32 both ways; the bytes sent are counted.
- Every member reduces an equal share of the vector's parts: a member that claims a bandwidth
  (hivemind would hand it a larger share, all of it for a large enough claim) or another averaging
  mode (a client reduces nothing) is refused like a bad payload.
- A leader refuses the join of a peer whose run digest (model layout and data, ``Layout.run_digest``)
  differs from its own, and a member that finds one in its group fails the attempt.
- Every part a member sends this reducer is checked before it is summed (``BoundedReducer``):
  weight 1, integers within the grid's levels, at most ``k`` nonzero values per chunk in a sparse
  run. A part that is not is refused, counted, its sender banned from the attempt (which then
  fails, and everyone matches again) and never grouped with again by this child (specs/diloco.md 8).
- With an allowlist (``membership``), a leader refuses the join of a peer whose payload is not
  signed by a listed node for its hivemind peer id, and a member that finds such a peer in its
  group fails the attempt and never asks that peer to lead it again (``AllowlistMatchmaking``).

The child runs one averager, so the allowlist and the refused peers are this module's state
(hivemind builds its ``Matchmaking`` itself, from the class name in its own module).
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
from typing import Any

import torch
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging import averager as hivemind_averager
from hivemind.averaging import matchmaking as hivemind_matchmaking
from hivemind.averaging.allreduce import AllreduceException, AllReduceRunner, AveragingMode
from hivemind.averaging.group_info import GroupInfo
from hivemind.averaging.key_manager import GroupKeyManager
from hivemind.averaging.partition import DEFAULT_PART_SIZE_BYTES, TensorPartReducer
from hivemind.compression import serialization as hivemind_serialization
from hivemind.compression.base import CompressionBase, CompressionInfo
from hivemind.proto import averaging_pb2, runtime_pb2
from hivemind.utils import get_logger
from hivemind.utils.asyncio import as_aiter, azip
from hivemind.utils.timed_storage import get_dht_time

from intellect_node.node.diloco import grid
from intellect_node.node.diloco.commit import COMMIT_S, CommitRefused, await_commit, commit_key, outcome_digests, post
from intellect_node.node.diloco.frames import FrameError, gather_payload, validate
from intellect_node.node.diloco.layout import CHUNK, Layout
from intellect_node.node.diloco.membership import disagreement, refusal
from intellect_node.node.diloco.packing import pack, unpack

logger = get_logger(__name__)


class PartialAllReduce(AllreduceException):
    """Some part of the all-reduce was not averaged over the whole group."""


class RoundKeys(GroupKeyManager):
    """Keeps the group key the caller set (the round) after a group assembles."""

    async def update_key_on_group_assembled(self, group_info: GroupInfo) -> None:
        return None


ALLOWLIST: frozenset[str] = frozenset()  # node peer ids; empty: anyone (set once by ExactAverager)
CHUNKS = 0
AGREEMENT = b""  # this member's run digest (Layout.run_digest): a member with another is refused
REFUSED: set[str] = set()  # hivemind peer ids refused in this process's life
GROUP_SIZE = 0  # the group of the all-reduce in progress (the packed deltas are scaled by it)
SENT: Any = None  # a shared counter of the packed bytes this member's averager sent
SPARSE_K = 0  # values per chunk a member may send in a sparse run; 0: a dense run
COMPRESSION_RATIO = 0.25  # GridWire's estimate: hivemind then cuts parts of 2^19 elements
# hivemind cuts the flat vector into parts of DEFAULT_PART_SIZE_BYTES / (4 * ratio) elements and hands
# whole parts to reducers, so every part starts on a chunk boundary: the k-per-chunk checks rely on it
PART_ELEMENTS = int(DEFAULT_PART_SIZE_BYTES / (4 * COMPRESSION_RATIO))
assert PART_ELEMENTS % CHUNK == 0


class LyingReducer(AllreduceException):
    """The sums a reducer replied cannot be the sum of the group's contributions."""


def reducer_spans(parts_by_reducer: tuple[int, ...], elements: int) -> list[tuple[int, int]]:
    """[start, end) of the flat vector each member reduced, in the group's order. hivemind's
    ``TensorPartContainer`` hands each reducer consecutive whole parts of ``PART_ELEMENTS`` (our
    averager holds one tensor and keeps hivemind's part size), so a vector under n parts leaves the
    last members an empty span, and one under a part is reduced by the first member alone."""
    spans, start = [], 0
    for parts in parts_by_reducer:
        end = min(start + parts * PART_ELEMENTS, elements)
        spans.append((start, end))
        start = end
    return spans


class PoisonedPart(AllreduceException):
    """A member's part is not an honest grid contribution (refused before it is summed)."""


class BoundedReducer(TensorPartReducer):
    """hivemind's reducer, refusing a part no honest member sends (``grid.contribution_error``):
    the bound that keeps one member's say in the average at most ``levels · 2^E / n`` per element."""

    def __init__(self, part_shapes: Any, senders: list[Any], levels: int, refused: Any) -> None:
        super().__init__(part_shapes, len(senders))
        self.senders, self.levels, self.refused = senders, levels, refused

    async def accumulate_part(self, sender_index: int, part_index: int, tensor_part: torch.Tensor,
                              weight: float = 1.0) -> torch.Tensor:
        why = grid.contribution_error(tensor_part, weight, self.levels, SPARSE_K)
        if why is not None:
            peer = self.senders[sender_index]
            REFUSED.add(str(peer))
            with self.refused.get_lock():
                self.refused.value += 1
            logger.warning("refused part %d from member %s: %s", part_index, peer, why)
            raise PoisonedPart(f"member {peer}: part {part_index}: {why}")
        return await super().accumulate_part(sender_index, part_index, tensor_part, weight)


class GridWire(CompressionBase):
    """``packing``'s exact format inside hivemind's all-reduce. It takes hivemind's BLOCKWISE_8BIT
    slot (that codec needs bitsandbytes, which we never install): hivemind decodes a part by the
    type named in it, from one registry, so only our children, which all register this, read it."""

    compression_type = runtime_pb2.CompressionType.BLOCKWISE_8BIT

    def compress(self, tensor: torch.Tensor, info: CompressionInfo, allow_inplace: bool = False) -> Any:
        buffer = pack(tensor, GROUP_SIZE, SPARSE_K)
        if SENT is not None:
            with SENT.get_lock():
                SENT.value += len(buffer)
        return runtime_pb2.Tensor(compression=self.compression_type, buffer=buffer, size=tensor.shape,
                                  dtype="float32", requires_grad=False)

    def extract(self, serialized_tensor: Any) -> torch.Tensor:
        shape = tuple(serialized_tensor.size)
        if len(shape) > 8 or any(d < 0 for d in shape) or math.prod(shape) > 2**31:
            raise ValueError(f"a packed part claims shape {shape[:9]}")
        return unpack(serialized_tensor.buffer, math.prod(shape), GROUP_SIZE, SPARSE_K).reshape(shape)

    def estimate_compression_ratio(self, info: CompressionInfo) -> float:
        return COMPRESSION_RATIO


def _decode(raw: bytes) -> dict[str, Any]:
    """One member's gather payload, checked against the schema (FrameError otherwise)."""
    try:
        bandwidth, mode, user_bytes = DecentralizedAverager.serializer.loads(raw)
        payload = DecentralizedAverager.serializer.loads(user_bytes)
    except (ValueError, TypeError) as exc:
        raise FrameError(f"undecodable payload: {exc}") from None
    if bandwidth is not None:  # hivemind splits the vector between reducers by the bandwidths members claim
        raise FrameError(f"a claimed bandwidth ({bandwidth!r}): every member reduces an equal share")
    if mode != AveragingMode.NODE.value:  # a client reduces nothing, which hands its share to the others
        raise FrameError(f"averaging mode {mode!r}: every member is a full node")
    if not isinstance(payload, dict):
        raise FrameError("the payload is not a map")
    return validate({"type": "gather"} | payload, gather_payload(CHUNKS))


class AllowlistMatchmaking(hivemind_matchmaking.Matchmaking):
    def _check_reasons_to_reject(self, request: Any, context: Any) -> Any:
        reason = super()._check_reasons_to_reject(request, context)
        if reason is not None:
            return reason
        peer = str(context.remote_id)
        if peer in REFUSED:
            logger.warning("refused %s: refused before in this process", peer)
            return averaging_pb2.MessageFromLeader(code=averaging_pb2.PROTOCOL_VIOLATION)
        try:
            payload = _decode(request.gather)
        except FrameError as exc:
            payload, why = None, str(exc)
        if payload is not None:
            # not remembered in REFUSED: the node may come back with the right store under the same hivemind id
            why = disagreement(payload, AGREEMENT)
            if why is None:
                why = refusal(payload, peer, ALLOWLIST)
                if why is not None:
                    REFUSED.add(peer)
        if why is None:
            return None
        logger.warning("refused %s: %s", peer, why)
        return averaging_pb2.MessageFromLeader(code=averaging_pb2.PROTOCOL_VIOLATION)

    async def _request_join_group(self, leader: Any) -> GroupInfo | None:
        if str(leader) in REFUSED:
            return None
        return await super()._request_join_group(leader)


hivemind_matchmaking.GroupKeyManager = RoundKeys  # this process runs only our averager
hivemind_averager.Matchmaking = AllowlistMatchmaking
hivemind_serialization._BASE_COMPRESSION_TYPES["BLOCKWISE_8BIT"] = GridWire()


def round_bits(round_: int) -> str:
    """The group bits of a round: peers of different rounds never share a key."""
    return format(round_, "032b")


def read_payloads(group_info: GroupInfo) -> dict[Any, dict[str, Any]]:
    """Each member's checked payload, by peer id; FrameError names the member that sent a bad one
    or one the allowlist refuses (and remembers it, so it is never asked to lead us again)."""
    out = {}
    for peer_id, raw in zip(group_info.peer_ids, group_info.gathered, strict=True):
        try:
            out[peer_id] = payload = _decode(raw)
        except FrameError as exc:
            raise FrameError(f"member {peer_id}: bad gather payload: {exc}") from None
        why = disagreement(payload, AGREEMENT)
        if why is not None:
            raise FrameError(f"member {peer_id} refused: {why}")
        why = refusal(payload, str(peer_id), ALLOWLIST)
        if why is not None:
            REFUSED.add(str(peer_id))
            raise FrameError(f"member {peer_id} refused: {why}")
    return out


class ExactAverager(DecentralizedAverager):
    def __init__(self, layout: Layout, layout_digest: bytes, levels: int, allowlist: frozenset[str],
                 sparse_k: int = 0, **kwargs: Any) -> None:
        global ALLOWLIST, CHUNKS, SENT, AGREEMENT, SPARSE_K
        ALLOWLIST, CHUNKS, AGREEMENT, SPARSE_K = allowlist, layout.chunks, layout_digest, sparse_k
        self.sent = SENT = mp.Value("q", 0)
        self.attempts = mp.Value("q", 0)  # all-reduce attempts begun (hivemind retries a failed one in its step)
        self.refused_parts = mp.Value("q", 0)  # parts refused by this member as a reducer (BoundedReducer)
        self.refused_replies = mp.Value("q", 0)  # reducers' replies this member refused (grid.sums_error)
        self.shared: dict[bytes, torch.Tensor] = {}  # group id -> the shared exponents of its attempt
        self.digests: dict[bytes, bytes] = {}  # group id -> this member's digests of its completed attempt
        self.layout, self.layout_digest, self.levels, self.sparse_k = layout, layout_digest, levels, sparse_k
        self.raw = torch.zeros(layout.elements).share_memory_()  # this member's x, set before each step
        super().__init__([torch.zeros(layout.elements)], allow_state_sharing=False, compression=GridWire(), **kwargs)

    async def _aggregate_with_group(self, group_info: GroupInfo, min_vector_size: int, **kwargs: Any) -> Any:
        """One attempt, applied only if every member's side completed (``commit``)."""
        key = commit_key(self.prefix, group_info.group_id)
        with self.attempts.get_lock():
            self.attempts.value += 1
        try:
            gathered = await self._checked_allreduce(group_info, min_vector_size, **kwargs)
            digests = self.digests.pop(group_info.group_id)
        except asyncio.CancelledError:
            raise
        except BaseException:
            await self._post_outcome(key, False)
            raise
        finally:
            self.shared.pop(group_info.group_id, None)
            self.digests.pop(group_info.group_id, None)
        await self._post_outcome(key, digests)
        try:
            await await_commit(self.dht, key, [p.to_bytes() for p in group_info.peer_ids], digests)
        except CommitRefused as exc:
            raise PartialAllReduce(str(exc)) from None
        return gathered

    async def _post_outcome(self, key: str, outcome: bytes | bool) -> None:
        try:
            await asyncio.wait_for(post(self.dht, key, self.peer_id.to_bytes(), outcome), COMMIT_S)
        except Exception as exc:  # the others then read silence, which fails the attempt too
            logger.warning("could not post this member's outcome: %r", exc)

    async def _checked_allreduce(self, group_info: GroupInfo, min_vector_size: int, **kwargs: Any) -> Any:
        try:
            payloads = read_payloads(group_info)
        except FrameError as exc:
            raise PartialAllReduce(str(exc)) from None
        mine = payloads[self.peer_id]
        if any(p["round"] != mine["round"] or p["layout"] != self.layout_digest for p in payloads.values()):
            raise PartialAllReduce("a member is in another round or has another model")
        if len(payloads) > grid.max_group(self.levels):
            raise PartialAllReduce(f"a group of {len(payloads)} is over this grid's exact limit")
        shared = grid.shared_exponents([torch.frombuffer(bytearray(p["exponents"]), dtype=torch.int8)
                                        for p in payloads.values()])
        self.shared[group_info.group_id] = shared
        global GROUP_SIZE
        GROUP_SIZE = len(payloads)
        with self.get_tensors() as tensors:
            tensors[0].copy_(grid.quantize(self.raw, shared, self.levels, self.sparse_k))
        return await super()._aggregate_with_group(group_info, min_vector_size, **kwargs)

    async def _run_allreduce_inplace_(self, tensors: Any, group_info: GroupInfo, group_id: bytes | None = None,
                                      **kwargs: Any) -> None:
        """hivemind's own loop, then the check it lacks: every part averaged over every member."""
        group_id = group_info.group_id if group_id is None else group_id
        runner = AllReduceRunner(p2p=self._p2p, servicer_type=type(self), prefix=self.prefix, tensors=tensors,
                                 group_id=group_id, ordered_peer_ids=group_info.peer_ids, **kwargs)
        runner.tensor_part_reducer = BoundedReducer(runner.tensor_part_reducer.part_shapes, runner.sender_peer_ids,
                                                    self.levels, self.refused_parts)
        self._running_groups[group_id].set_result(runner)
        async for tensor, update in azip(as_aiter(*tensors), runner):
            tensor.add_(update, alpha=self._averaging_alpha)
            self.last_updated = get_dht_time()
            self._state_updated.set()
        if runner.tensor_part_container.failed_size or runner.banned_senders:
            raise PartialAllReduce(f"{runner.tensor_part_container.failed_size} elements not averaged, "
                                   f"{len(runner.banned_senders)} senders dropped")
        # a pass over the whole vector (checks, fp64 sums, sha256): off the averager's event loop
        self.digests[group_id] = await asyncio.get_running_loop().run_in_executor(
            None, self._audit, tensors[0], group_info.peer_ids, self.shared[group_id],
            runner.tensor_part_container.num_parts_by_peer)

    def _audit(self, averaged: torch.Tensor, reducers: Any, shared: torch.Tensor,
               parts_by_reducer: tuple[int, ...]) -> bytes:
        """This member's commit digests (``commit.outcome_digests``), once every reducer's span is
        checked to hold an average of honest contributions; a reducer whose span does not is refused
        (``LyingReducer``)."""
        n = len(reducers)
        returned = averaged.view(-1)
        spans = reducer_spans(parts_by_reducer, returned.numel())
        for reducer, (start, end) in zip(reducers, spans, strict=True):
            why = grid.sums_error(returned[start:end], n, self.levels, self.sparse_k)
            if why is not None:
                REFUSED.add(str(reducer))
                with self.refused_replies.get_lock():
                    self.refused_replies.value += 1
                logger.warning("refused the replies of reducer %s (elements %d-%d): %s", reducer, start, end, why)
                raise LyingReducer(f"reducer {reducer}: {why}")
        return outcome_digests([p.to_bytes() for p in reducers], shared.numpy().tobytes(),
                               grid.recover_sums(returned, n), spans)
