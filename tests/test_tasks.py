"""Task sets and verifiers: schema and files, toy tasks, math equivalence, the code sandbox."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from pathlib import Path

import pytest

from intellect_node.node.roles.trainer.evaluation import held_out_tasks
from intellect_node.node.tasks.code_verifier import extract_code, verify_code
from intellect_node.node.tasks.math_verifier import last_boxed, verify_math
from intellect_node.node.tasks.sandbox import SandboxLimits, run_python
from intellect_node.node.tasks.schema import Task, filter_by_solve_rate, load_tasks, save_tasks, with_length_target
from intellect_node.node.tasks.spec import TaskSpecError, load_task_spec
from intellect_node.node.tasks.toy import SMALL_MODEL_KINDS, generate_toy_tasks, is_held_out, verify_toy
from intellect_node.node.tasks.verify import task_reward

FAST = SandboxLimits(timeout_s=2.0, memory_mb=256)


# --- schema, files, filters, length targets ---------------------------------------------------


def test_jsonl_round_trip_and_string_verification_info(tmp_path: Path) -> None:
    tasks = generate_toy_tasks(seed=1, count=6)
    path = tmp_path / "tasks.jsonl"
    save_tasks(path, tasks)
    assert load_tasks(path) == tasks
    # the published INTELLECT-2 data stores verification_info as a JSON string
    record = {
        "problem_id": "m1",
        "task_type": "math",
        "prompt": "What is 1/2 + 1/4?",
        "verification_info": json.dumps({"ground_truth": "\\frac{3}{4}"}),
        "solve_rate": 0.5,
    }
    path.write_text(json.dumps(record) + "\n")
    (task,) = load_tasks(path)
    assert task.verification_info == {"ground_truth": "\\frac{3}{4}"}


@pytest.mark.parametrize(
    "change",
    [
        {"task_type": "poetry"},
        {"solve_rate": 1.5},
        {"prompt": ""},
        {"extra": 1},
    ],
)
def test_bad_records_are_refused(tmp_path: Path, change: dict) -> None:
    record = generate_toy_tasks(seed=0, count=1)[0].to_json() | change
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_tasks(path)


def test_duplicate_ids_are_refused(tmp_path: Path) -> None:
    task = generate_toy_tasks(seed=0, count=1)[0]
    path = tmp_path / "dup.jsonl"
    save_tasks(path, [task, task])
    with pytest.raises(ValueError, match="duplicate"):
        load_tasks(path)


def test_solve_rate_band() -> None:
    def make(i: int, rate: float | None) -> Task:
        return Task(f"p{i}", "math", "q", {"ground_truth": "1"}, rate)

    tasks = [make(i, r) for i, r in enumerate([0.0, 0.05, 0.1, 0.5, 0.8, 0.9, None])]
    assert [t.solve_rate for t in filter_by_solve_rate(tasks)] == [0.1, 0.5, 0.8]
    kept = filter_by_solve_rate(tasks, 0.0, 0.05, keep_unknown=True)
    assert [t.solve_rate for t in kept] == [0.0, 0.05, None]


def test_length_target_appended_and_recorded() -> None:
    task = generate_toy_tasks(seed=0, count=1)[0]
    targeted = with_length_target(task, 64)
    assert targeted.prompt == task.prompt + " Think for 64 tokens before giving a response."
    assert targeted.length_target == 64 and targeted.task is task
    with pytest.raises(ValueError):
        with_length_target(task, 0)


# --- toy tasks --------------------------------------------------------------------------------


def test_toy_tasks_are_seeded_and_correct() -> None:
    a, b = generate_toy_tasks(seed=7, count=40), generate_toy_tasks(seed=7, count=40)
    assert a == b
    assert a != generate_toy_tasks(seed=8, count=40)
    assert {t.verification_info["kind"] for t in a} == {"add", "reverse"}
    for task in a:
        info = task.verification_info
        if info["kind"] == "add":
            x, y = (int(w) for w in task.prompt.removeprefix("What is ").rstrip("?").split(" + "))
            assert info["answer"] == str(x + y)
        else:
            digits = task.prompt.removeprefix("Reverse the digits ").rstrip(".")
            assert digits.isdigit() and info["answer"] == digits[::-1]


def test_held_out_problems_of_small_model_kinds_are_never_trained_on() -> None:
    """One-digit sums and products are so few that any two seeded sets share most of them: the
    evaluation draws only from a fixed quarter no training set of any seed draws from."""
    kinds = SMALL_MODEL_KINDS
    held_out = held_out_tasks(200, kinds)
    assert held_out == held_out_tasks(200, kinds) and {t.verification_info["kind"] for t in held_out} == set(kinds)
    evaluated = {t.prompt for t in held_out}
    for seed in range(5):
        trained = {t.prompt for t in load_task_spec(f"toy:seed={seed},count=2000,kinds={'+'.join(kinds)}")}
        assert not trained & evaluated
        assert all(not is_held_out(t.verification_info["kind"], t.prompt)
                   for t in load_task_spec(f"toy:seed={seed},count=200,kinds={'+'.join(kinds)}"))
    # both splits together are every problem of the kind: a quarter-ish is held out, none lost
    sums = {t.prompt for t in generate_toy_tasks(0, 2000, ("add1",))} | \
        {t.prompt for t in generate_toy_tasks(0, 2000, ("add1",), split="held_out")}
    assert len(sums) == 81
    assert 0.1 < sum(is_held_out("add1", p) for p in sums) / 81 < 0.4
    # the tiny model's kinds keep one split: the same tasks either way
    assert generate_toy_tasks(4, 30) == generate_toy_tasks(4, 30, split="held_out")
    with pytest.raises(ValueError, match="unknown split"):
        generate_toy_tasks(0, 1, split="test")


def test_small_model_kinds_ask_for_only_the_number_and_carry_its_answer() -> None:
    tasks = load_task_spec("toy:seed=3,count=400,kinds=add1+mul1+sub+cm")
    assert {t.verification_info["kind"] for t in tasks} == {"add1", "mul1", "sub", "cm"}
    for task in tasks:
        assert task.prompt.endswith("Answer with only the number.")
        numbers = [int(n) for n in re.findall(r"\d+", task.prompt)]
        kind, answer = task.verification_info["kind"], int(task.verification_info["answer"])
        expected = {"add1": lambda a, b: a + b, "mul1": lambda a, b: a * b, "sub": lambda a, b: a - b,
                    "cm": lambda m: m * 100}[kind](*numbers)
        assert answer == expected and task_reward(task, f"{answer}.") == 1.0 and task_reward(task, "0") == 0.0
    with pytest.raises(TaskSpecError, match="kinds among"):
        load_task_spec("toy:seed=3,count=4,kinds=add1+div")


def test_toy_verifier() -> None:
    info = {"kind": "add", "answer": "57"}
    assert verify_toy("57", info)
    assert verify_toy("  thinking... 20 plus 37 is 57\n", info)
    assert not verify_toy("57 or 58", info)
    assert not verify_toy("5 7", info)
    assert not verify_toy("", info)
    assert verify_toy("The sum is 57.", info) and not verify_toy("57.5", info) and not verify_toy("57 cm", info)
    task = Task("t", "toy", "What is 20 + 37?", info)
    assert task_reward(task, "57") == 1.0 and task_reward(task, "56") == 0.0


# --- math --------------------------------------------------------------------------------------


def test_last_boxed_extraction() -> None:
    assert last_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{\\sqrt{\\frac{a}{b}}}") == "\\sqrt{\\frac{a}{b}}"
    assert last_boxed("no box here") is None
    assert last_boxed("\\boxed{unclosed") is None


@pytest.mark.parametrize(
    ("truth", "answer"),
    [
        ("\\frac{1}{2}", "0.5"),
        ("\\frac{1}{2}", "1/2"),
        ("\\frac{1}{2}", "\\dfrac{2}{4}"),
        ("x^2+2x+1", "(x+1)^2"),
        ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
        ("3", "3.0"),
    ],
)
def test_math_accepts_equivalent_forms(truth: str, answer: str) -> None:
    assert verify_math(f"Work... so the answer is \\boxed{{{answer}}}.", {"ground_truth": truth})


@pytest.mark.parametrize(
    ("truth", "completion"),
    [
        ("\\frac{1}{2}", "\\boxed{0.6}"),
        ("3", "\\boxed{2}"),
        ("[1,2]", "\\boxed{[1,2)}"),
        ("\\pi", "\\boxed{3.14159}"),
        ("\\frac{1}{2}", "the answer is 1/2"),  # no box, no reward
        ("1", "\\boxed{}"),
    ],
)
def test_math_rejects_wrong_answers(truth: str, completion: str) -> None:
    assert not verify_math(completion, {"ground_truth": truth})


def test_math_times_out_on_hostile_input_and_recovers() -> None:
    assert not verify_math("\\boxed{9^{9^{9^{9}}}}", {"ground_truth": "1"}, timeout_s=1.0)
    assert verify_math("\\boxed{1}", {"ground_truth": "1"})  # a fresh child took over


def test_math_works_from_worker_threads() -> None:
    """The node verifies off the trio loop; math-verify's signal-based timeout would fail there."""
    results: list[bool] = []

    def work() -> None:
        results.append(verify_math("\\boxed{0.25}", {"ground_truth": "\\frac14"}))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True, True, True]


# --- code sandbox ----------------------------------------------------------------------------


def test_sandbox_runs_a_program() -> None:
    result = run_python("print(input()[::-1])", stdin="abc\n", limits=FAST)
    assert result.ok and result.stdout == "cba\n"


def test_sandbox_stops_an_infinite_loop() -> None:
    result = run_python("while True:\n    pass\n", limits=SandboxLimits(timeout_s=1.0))
    assert result.timed_out and not result.ok
    assert result.wall_s < 3.0


def test_sandbox_stops_a_memory_bomb() -> None:
    bomb = "chunks = []\nwhile True:\n    chunks.append(bytearray(50 << 20))\n"
    result = run_python(bomb, limits=FAST)
    assert not result.ok and not result.timed_out
    assert "MemoryError" in result.stderr


def test_sandbox_blocks_network_calls() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        port = server.getsockname()[1]
        source = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        result = run_python(source, limits=FAST)
        assert not result.ok and "PermissionError" in result.stderr
        with pytest.raises(TimeoutError):
            server.accept()  # nothing ever connected


def test_sandbox_has_its_own_network_namespace() -> None:
    result = run_python("import os\nprint(os.readlink('/proc/self/ns/net'))", limits=FAST)
    assert result.ok and result.network_namespace
    assert result.stdout.strip() != os.readlink("/proc/self/ns/net")


@pytest.mark.parametrize(
    "source",
    [
        "import os\nos.fork()",
        "import subprocess\nsubprocess.run(['true'])",
        "import socket\nsocket.socket()",
        "open('/tmp/ina-sandbox-escape.txt', 'w').write('x')  # the sandbox's own /tmp\nopen('/usr/x', 'w')",
    ],
)
def test_sandbox_refuses_escapes(source: str) -> None:
    result = run_python(source, limits=FAST)
    assert not result.ok and "Error" in result.stderr
    assert not Path("/tmp/ina-sandbox-escape.txt").exists()


def test_sandbox_caps_output() -> None:
    result = run_python("while True:\n    print('x' * 1000)\n", limits=FAST)
    assert not result.ok and len(result.stdout) <= FAST.output_bytes


def test_code_verifier() -> None:
    info = {
        "language": "python",
        "test_cases": [
            {"type": "stdin_stdout", "input": "2 3\n", "output": "5\n"},
            {"type": "stdin_stdout", "input": "10 -4\n", "output": "6"},
            {"type": "assert", "code": "assert add(1, 2) == 3"},
        ],
    }
    good = (
        "Here:\n```python\nimport sys\n\ndef add(a, b):\n    return a + b\n\n"
        "args = sys.stdin.read().split()\nif args:\n    print(add(*map(int, args)))\n```"
    )
    assert extract_code(good) is not None
    assert verify_code(good, info, FAST)
    wrong = good.replace("a + b", "a - b")
    assert not verify_code(wrong, info, FAST)
    assert not verify_code("def add(a, b): return a + b", info, FAST)  # no fenced block
    slow = "```python\nwhile True:\n    pass\n```"
    assert not verify_code(slow, info, SandboxLimits(timeout_s=0.5))
    with pytest.raises(ValueError):
        verify_code(good, {"test_cases": [{"type": "mystery"}]}, FAST)


# --- no sandbox, no code tasks ------------------------------------------------------------------


@pytest.fixture
def no_bubblewrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A PATH without bwrap (nor unshare, setpriv, mount): the machine as it is before `apt-get install`."""
    from intellect_node.node.tasks.sandbox import sandbox_problem

    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    sandbox_problem.cache_clear()
    yield {**os.environ, "PATH": str(empty)}
    sandbox_problem.cache_clear()


def test_code_tasks_are_refused_without_the_sandbox(no_bubblewrap: dict[str, str], tmp_path: Path) -> None:
    from intellect_node.node.tasks.spec import TaskSpecError, load_task_spec

    with pytest.raises(TaskSpecError, match=r"code tasks.*bwrap.*not found.*apt-get install -y bubblewrap"):
        load_task_spec("humaneval:count=1")
    assert load_task_spec("toy:seed=1,count=2")  # tasks that run no code need no sandbox
    path = tmp_path / "code.jsonl"
    save_tasks(path, [Task("c1", "code", "p", {"test_cases": [{"type": "assert", "code": "assert 1"}]}, None)])
    with pytest.raises(TaskSpecError, match="code tasks"):
        load_task_spec(str(path))


def test_a_node_with_code_tasks_refuses_to_start_without_the_sandbox(no_bubblewrap: dict[str, str],
                                                                     tmp_path: Path) -> None:
    """The whole command, not a unit: it exits with the cause before anything starts, never runs code unisolated."""
    import subprocess
    import sys

    join = ["join", "--role", "inference", "--new-swarm", "--model", "tiny", "--tasks", "humaneval:count=2",
            "--home", str(tmp_path), "--listen", "/ip4/127.0.0.1/tcp/0"]
    done = subprocess.run([sys.executable, "-m", "intellect_node.cli.main", *join], env=no_bubblewrap,
                          capture_output=True, text=True, timeout=120)
    stderr = " ".join(done.stderr.split())
    assert done.returncode == 2 and "code tasks" in stderr and "bubblewrap" in stderr, done.stderr
    assert not (tmp_path / "models").exists()


def test_the_sysctl_that_forbids_user_namespaces_is_named(tmp_path: Path) -> None:
    from intellect_node.node.tasks.sandbox import userns_blocked

    assert userns_blocked(tmp_path) is None  # a kernel without these switches
    (tmp_path / "kernel").mkdir()
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "max_user_namespaces").write_text("15000\n")
    (tmp_path / "kernel" / "apparmor_restrict_unprivileged_userns").write_text("0\n")
    assert userns_blocked(tmp_path) is None
    (tmp_path / "kernel" / "unprivileged_userns_clone").write_text("0\n")
    assert "kernel.unprivileged_userns_clone = 0" in userns_blocked(tmp_path)
    (tmp_path / "user" / "max_user_namespaces").write_text("0\n")
    assert "user.max_user_namespaces = 0" in userns_blocked(tmp_path)
