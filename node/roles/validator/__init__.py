"""The validator role (specs/validation.md).

- ``service``: ``ValidatorService``, the node service: judge the inbox, sign and gossip verdicts,
  ban proven cheats. The trainer runs the same service to verify what it trains on.
- ``config``: ``ValidatorOptions``, what the role is given (torch-free: ``join`` builds it).
- ``validation``: ``verify_batch``, the checks themselves (assignment, prefill, TOPLOC, logprobs,
  termination, rewards); compute only, no network.
- ``answer_span``: the final answer span of a completion, where no token may be a flip.
- ``ledger``: ``JudgeState``, dense counters and the content index a validator keeps between batches.
- ``commitments``: ``CommitmentBook``, the work commitments stored before their beacon; settles
  committed counters never delivered.
- ``delivery``: ``DeliveryLedger``, each worker's delivery share over its settled commitments: a
  trainer trains on a worker's groups only while it delivers what it commits.
- ``calibrate``: honest batches of one engine judged by another, measured (``intellect-node calibrate``).
- ``offline``: one stored batch judged by ``verify_batch`` without a network (``intellect-node verify``).
- ``verdict_records``: ``<home>/verdicts``, a durable record per batch done with; read back at a restart.
- ``verdict_trust``: verdicts from validators this node trusts: bans, and verification a trainer
  may skip.
"""
