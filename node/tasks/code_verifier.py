"""Code answers: the completion's last fenced Python block, run against the task's unit tests.

``verification_info`` holds ``{"language": "python", "test_cases": [...]}`` (the INTELLECT-2
layout), each test case one of:

- ``{"type": "stdin_stdout", "input": "...", "output": "..."}``: the program reads ``input`` on
  stdin and must print ``output`` (compared line by line, trailing whitespace ignored);
- ``{"type": "assert", "code": "..."}``: ``code`` (e.g. ``assert add(1, 2) == 3``) must run to its
  end against the solution's functions; it runs in a sandbox of its own that sees the solution
  only through plain values (``intellect_node.node.tasks.assert_check``), so no exit status, exit
  hook, trace hook or odd ``__eq__`` of the solution's can make it pass.

Every test runs in its own sandbox (``intellect_node.node.tasks.sandbox``). The reward is binary: all
tests pass or nothing, as a partial score would reward programs that special-case easy tests.
Without kernel isolation on this machine ``SandboxUnavailable`` is raised: nothing runs unisolated.
"""

from __future__ import annotations

import re
from typing import Any

from intellect_node.node.tasks.assert_check import passes_asserts
from intellect_node.node.tasks.sandbox import SandboxLimits, run_python

_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(completion: str) -> str | None:
    """The last fenced code block (```python ... ```), or None when there is none."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else None


def _normalize(output: str) -> list[str]:
    return [line.rstrip() for line in output.strip().splitlines()]


def _check_info(info: dict[str, Any]) -> list[dict[str, Any]]:
    if info.get("language", "python") != "python":
        raise ValueError(f"unsupported language {info.get('language')!r}")
    cases = info.get("test_cases")
    if not isinstance(cases, list) or not cases:
        raise ValueError("verification_info needs a non-empty test_cases list")
    for case in cases:
        kind = case.get("type") if isinstance(case, dict) else None
        if kind == "stdin_stdout":
            if not isinstance(case.get("input"), str) or not isinstance(case.get("output"), str):
                raise ValueError("stdin_stdout test case needs string input and output")
        elif kind == "assert":
            if not isinstance(case.get("code"), str):
                raise ValueError("assert test case needs string code")
        else:
            raise ValueError(f"unsupported test case type {kind!r}")
    return cases


def verify_code(
    completion: str, verification_info: dict[str, Any], limits: SandboxLimits | None = None
) -> bool:
    """True when the extracted program passes every test case within the sandbox limits.

    Malformed ``verification_info`` raises ValueError (task files are ours and must be right);
    anything the program does wrong is just a failed test.
    """
    cases = _check_info(verification_info)
    code = extract_code(completion)
    if code is None:
        return False
    for case in cases:
        if case["type"] == "stdin_stdout":
            result = run_python(code, stdin=case["input"], limits=limits)
            if not result.ok or _normalize(result.stdout) != _normalize(case["output"]):
                return False
        elif not passes_asserts(code, case["code"], limits):
            return False
    return True
