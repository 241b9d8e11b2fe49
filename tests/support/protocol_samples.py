"""Sample messages shared by the protocol tests."""

from intellect_node.crypto.identity import Identity
from intellect_node.protocol.messages import Hardware, NodeAdvert

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
