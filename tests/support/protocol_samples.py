"""Sample messages shared by the protocol tests: well-formed, so each test changes one thing."""

from intellect_node.crypto.identity import Identity
from intellect_node.protocol.messages import Hardware, NodeAdvert
from intellect_node.protocol.rollouts import (
    CompletionRecord,
    RolloutBatch,
    RolloutGroup,
    SamplingSettings,
    pack_logprobs,
    pack_tokens,
    proof_count,
)

CPU_HARDWARE = Hardware(
    accelerator="cpu", accelerator_name="x86_64", accelerator_count=0, accelerator_memory_bytes=0,
    cpu_cores=2, ram_bytes=24 << 30, disk_free_bytes=80 << 30,
)


def sample_advert(identity: Identity, **changes) -> NodeAdvert:
    fields = dict(
        peer_id=identity.peer_id, run_id="test-run", roles=("inference",),
        addrs=("/ip4/127.0.0.1/tcp/4001",), hardware=CPU_HARDWARE, throughput_tokens_per_s=1234.5,
        software_version="0.1.0", policy_step=7,
    )
    fields.update(changes)
    return NodeAdvert(**fields)


SAMPLE_WORKER = Identity.generate()


def sample_completion(tokens: int = 40, **changes) -> CompletionRecord:
    """A completion of ``tokens`` tokens with proofs of the right count (their bytes are zeros)."""
    fields = dict(token_ids=pack_tokens(range(tokens)), logprobs=pack_logprobs([-0.5] * tokens), finish_reason="stop",
                  proofs=tuple(bytes(258) for _ in range(proof_count(tokens))), reward=1.0)
    fields.update(changes)
    return CompletionRecord(**fields)


def sample_batch(groups=None, **changes) -> RolloutBatch:
    """A batch of ``SAMPLE_WORKER`` with two groups (one with a length target, one without)."""
    fields = dict(
        run_id="r", worker=SAMPLE_WORKER.peer_id, policy_step=3, manifest_hash=bytes(range(32)), engine="torch",
        sampling=SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=64),
        groups=groups if groups is not None else (
            RolloutGroup(counter=0, task_id="t0", length_target=50, prompt_ids=pack_tokens([1, 2, 3]),
                         completions=(sample_completion(40), sample_completion(33, finish_reason="length"))),
            RolloutGroup(counter=1, task_id="t1", length_target=None, prompt_ids=pack_tokens([4]),
                         completions=(sample_completion(1),)),
        ),
    )
    fields.update(changes)
    return RolloutBatch(**fields)
