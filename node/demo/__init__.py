"""A whole swarm on this machine, for newcomers and for the tests.

- ``swarm``: ``intellect-node demo``: a trainer (the others' bootstrap peer), inference nodes and a
  validator as processes on 127.0.0.1, learning a toy task.
- ``diloco``: ``intellect-node demo --workload diloco``: DiLoCo nodes on 127.0.0.1 pretraining the
  tiny Llama; metrics.jsonl, loss.png, summary.json.
- ``metagene``: ``intellect-node demo --workload metagene``: a generated metagenome, its tokenizer
  and read store, then the DiLoCo demo on it; held-out perplexity and probe MCC before and after.
- ``local_swarm``: starting and stopping real node processes on 127.0.0.1.
- ``dashboard``: the live terminal view.
- ``shipping``: what each step shipped (a delta, an adapter, the checkpoint) and when it reached the last worker.
- ``plot``: reward.png from metrics.jsonl.
- ``churn``: fresh identities that connect to one node from a chosen 127.0.0.x, advertise and
  leave (the connection tests and bench/connections.py).
"""
