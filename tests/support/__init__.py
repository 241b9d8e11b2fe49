"""What the tests share that is not a test: models, namespaces, swarms and samples they build.

- ``attacker``: an attacker's own libp2p peer aimed at one node.
- ``engine_helpers``: the tiny models the engine, rollout and validation tests load (cached per session).
- ``gguf_helpers``: tiny random Llama models written as GGUF files (llama.cpp's layout).
- ``decode_reference``: transformers' own decode loop beside the static decoder's, fed the same tokens.
- ``diloco_helpers``: DiLoCo peers, averager children and generated corpora for the DiLoCo tests.
- ``grpo_groups``: a small random Qwen2 policy and GRPO groups sampled as if from it.
- ``inprocess_nodes``: real libp2p nodes started in the test's own trio loop.
- ``judging_world``: two checkpoints, a validator and a worker engine, and forgeries by a real key.
- ``netns``: the namespace internet (publics, homes behind NAT, rate-limited links).
- ``protocol_samples``: well-formed messages to mutate in the wire tests.
- ``reaper``: ends the processes a test module left running, and names them.
- ``steering``: a forger that flips a completion's answer within the engine pair's slack, re-proven.
- ``shards_swarm``: a checkpoint overlay of node processes with a publishing trainer.
- ``trainer_runs``: quick timings, the toy task set and record readers for live trainer runs.
- ``toploc_golden``: the reference toploc package's proofs for fixed inputs (tests/golden/).
- ``toploc_model``: the Llama-shaped model whose hidden states the TOPLOC tests prove.
- ``waiting``: polls with a deadline, for states other processes and libraries reach with no event.
"""
