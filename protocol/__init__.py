"""Wire formats and pure protocol logic; no sockets, no threads started, no model.

The bytes:

- ``schema``: the strict field validators every message is decoded through.
- ``bounded_msgpack``: msgpack decoding under explicit bounds (bytes, lengths, nesting, objects).
- ``codec``: bytes <-> signed, schema-checked messages (size limit before decoding).
- ``framing``: length-prefixed frames on libp2p streams, and the delivery reply.
- ``overlay_routes``: the checkpoint overlay's request targets (manifest, delta, have, shard ranges).
- ``errors``: one exception class per rejection reason, each with a stable ``reason``.

The messages:

- ``messages``: the message types (``NodeAdvert``, ...) and their registry.
- ``manifest``: the weight broadcast's signed checkpoint manifests and shard complaints.
- ``deltas``: the sparse, exact delta between two steps' checkpoints (``sparse/v2``).
- ``lora``: LoRA adapters on the wire (``lora/v1``) and the exact merge every node computes alike.
- ``rollouts``: the rollout batch a worker delivers, with its groups and completions.
- ``verdicts``: a validator's signed judgement of one batch, and every rejection reason.
- ``commitments``: a worker's signed promise of how many groups it delivers for a coming step.
- ``run_spec``: the signed run specs (RL and DiLoCo): build, sign, load (bounded), check.

The rules peers must agree on:

- ``rollout_shape``: the run's rollout shape (group size, sampling, completion budget, length targets).
- ``assignment``: which task, length target and sampling seed a worker's counter gets.
- ``sampling``: the replayable sampler: each token a public function of the seed and the model.
- ``compiled``: the sampler's race run through ``torch.compile`` on a GPU (eager elsewhere, or if it fails).
- ``keys``: DHT keys and gossip topic names derived from run id and peer id.

The normative description of every byte lives in ``specs/``; this package follows it. Nothing here
imports ``node`` or ``cli``.
"""
