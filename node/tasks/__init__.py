"""Task sets and their verifiers, for the inference, validator and trainer roles.

- ``node.tasks.schema``: the ``Task`` record (INTELLECT-2 schema), JSON-lines files, the offline
  solve-rate filter and the "Think for N tokens" length instruction.
- ``node.tasks.toy``: seeded toy tasks (two-digit addition, word reversal) and their verifier.
- ``node.tasks.math_verifier``: last ``\\boxed{}`` answer vs ground truth, symbolic equivalence
  (math-verify) in a time- and memory-limited child process.
- ``node.tasks.code_verifier``: fenced Python program vs stdin/stdout or assert tests.
- ``node.tasks.sandbox``: the locked-down child process the code tests run in.
- ``node.tasks.verify``: ``task_reward(task, completion)``, dispatching on the task type.
- ``node.tasks.solve_rate``: measure solve rates with a model, for the offline filter.

Which task a worker solves is not chosen here: ``protocol.assignment`` derives it from a hash.
"""
