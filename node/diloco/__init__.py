"""DiLoCo on hivemind (specs/diloco.md): inner AdamW steps, an exact group average of
pseudo-gradients, the same outer Nesterov step on every peer. One job per module:

- ``layout``: the canonical order of a model's tensors, flat fp32 vectors, chunks, the layout hash.
- ``compressions``: the compressions a run may name and each one's levels or values kept per chunk.
- ``grid``: the shared int grid that makes the all-reduce exact (int4, int8, int16 with per-chunk
  power-of-two scales; sparse top-k of each chunk in 2-bit codes), sum recovery, the average, error
  feedback, the median-bounded shared scale and the check of each member's contribution.
- ``outer``: the global state (outer params, outer momentum, round) and the outer Nesterov step.
- ``state_hash``: sha256 of the global state, equal on every honest peer after each outer step.
- ``state_file``: the global state as a shard-overlay checkpoint file (the same bytes on every
  honest peer), read back only when it is exactly the state its hash says.
- ``state_overlay``: the state through the shard overlay: served after every outer step under a
  manifest this node signs; a joiner fetches only what a majority of live members vouch for.
- ``checkpoint``: save and resume at a round boundary (global state, residual, inner AdamW),
  durably, with every field checked on load.
- ``packing``: how the grid's numbers travel inside hivemind's all-reduce, the exact packed format
  (dense tags, and the sparse index-and-code tags, each field checked on the way in).
- ``sparse_indices``: the Elias-Fano coding of a sparse part's block-local indices (about 7 bits
  an index at top-128 of 4,096), whole-array in and out.
- ``frames``: length-prefixed msgpack frames between the node and the averager child, size-limited
  before decoding, each message checked against its schema.
- ``recipe``: the inner optimizer: AdamW (decay on matrices only), warm-up, cosine to a floor, clipping;
  a peer's is constant (``[diloco] inner_lr``).
- ``llama``: Llama-shaped model presets and their seeded build (θ0 from the run's seed).
- ``workload``: what a workload plugs in (presets and their build, its data spec, its data and loss),
  and the registry of known workloads; node/metagene/workload.py registers METAGENE's.
- ``toy_lm``: the built-in workload: the generated corpus and a tiny Llama.
- ``settings``: the ``[diloco]`` section as one checked dataclass (models and data from the workloads).
- ``data_spec``: the ``data`` line's items, the generated corpus's spec parsed and bounded, without torch.
- ``permutation``: the keyed Feistel permutation a peer's samples are drawn by, with no coordination.
- ``data``: a peer's samples for (seed, round, peer id) and their loss (``PeerData``), and the
  generated corpus's.
- ``adverts``: the child's hivemind address in the node's signed advert (``/hivemind/`` form), and back;
  the state server's (``/http/diloco-state``).
- ``membership``: a member's node identity signed into a round and bound to its hivemind peer id;
  the allowlist check.
- ``run_spec``: the allowlist and the compression from the run owner's signed ``diloco_run_spec``
  (``[diloco] run_spec``).
- ``commit``: the commit step of an all-reduce attempt: applied only when every member says its
  side completed (hivemind's all-reduce can complete on one member and fail on another).
- ``exact_averager``: the ``DecentralizedAverager`` subclass that quantizes onto the group's grid,
  refuses partial all-reduces and parts no honest member sends (runs inside the child only).
- ``averager_child``: the hivemind process (DHT and averager) serving those frames; it never
  imports libp2p (the two cannot share a process).
- ``client``: the node side: starts the child, restarts it if it died, ends its process group.
- ``peer``: one DiLoCo peer: inner steps, the exact average, the outer step (blocking, or one
  round late with the all-reduce overlapping the next round), the checkpoint, adopting a fetched state.
- ``service``: the ``diloco`` role in a node: rounds in a worker thread, the state served and
  fetched between them, the progress line, ``<home>/diloco/metrics.jsonl``, ``status``.
"""
