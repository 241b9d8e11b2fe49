"""The running node: one sub-package per concern. Installed as ``intellect_node.node``.

- ``swarm``: the libp2p host, streams, gossip, DHT access, signed adverts and membership, peer
  scores and bans, the peer cache, hardware, and the control socket ``status`` reads.
- ``shards``: the checkpoint overlay (SHARDCAST, done right): signed manifests, verified shards.
- ``rollouts``: rollout batches between nodes: the delivery protocol and the durable inbox.
- ``roles``: one sub-package per role (``inference``, ``validator``, ``trainer``).
- ``diloco``: DiLoCo pretraining on hivemind: exact group averaging, the outer step, the averager
  child process and the ``diloco`` role.
- ``engine``: generation and prefill engines (torch, vLLM) and TOPLOC proof building.
- ``tasks``: task sets and reward verifiers (toy, math, code sandbox).
- ``app``: one node process: configuration, role assembly, logging, signals.
- ``home``: what a node keeps on disk, written durably.
- ``config``: the typed config machinery every section is built on (one error type, one loader).
- ``metagene``: the METAGENE-1 workload: reads in, tokenizer, packing, pretraining, evaluation.
- ``models``: real pretrained models (GGUF, HF) brought into the HF layout the engines load.
- ``demo``: a whole swarm on this machine, its dashboard and plot, and the tiny CPU model.

Dependencies point one way: ``cli -> node -> protocol -> crypto``. Inside ``node``, each tier
imports only the tiers below it (tests/test_layering.py holds the tree to it)::

    demo
    app
    metagene
    roles, diloco
    rollouts, shards, engine, tasks, models
    swarm
    home, config
"""
