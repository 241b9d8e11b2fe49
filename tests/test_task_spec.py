import pytest

from intellect_node.node.tasks.schema import save_tasks
from intellect_node.node.tasks.spec import TaskSpecError, load_task_spec
from intellect_node.node.tasks.toy import generate_toy_tasks


def test_toy_specs_are_deterministic_and_configurable():
    first = load_task_spec("toy:seed=4,count=30")
    assert first == load_task_spec("toy:seed=4,count=30")
    assert len(first) == 30 and first != load_task_spec("toy:seed=5,count=30")
    assert {t.verification_info["kind"] for t in load_task_spec("toy:count=10,kinds=reverse")} == {"reverse"}
    assert len(load_task_spec("toy")) == 1000


def test_task_files_load_in_order(tmp_path):
    tasks = generate_toy_tasks(seed=1, count=7)
    save_tasks(tmp_path / "tasks.jsonl", tasks)
    assert load_task_spec(str(tmp_path / "tasks.jsonl")) == tasks


@pytest.mark.parametrize("spec", ["toy:seed=x", "toy:count=0", "toy:kinds=chess", "toy:color=red", "toy:seed",
                                  "/nonexistent/tasks.jsonl"])
def test_bad_specs_say_what_is_wrong(spec):
    with pytest.raises(TaskSpecError):
        load_task_spec(spec)


@pytest.mark.parametrize("content,match", [
    (b"\xff\xfe{}\n", r":1: 'utf-8' codec can't decode"),
    (b"[" * 10_000 + b"]" * 10_000 + b"\n", ":1: JSON nested too deeply"),
    (b"x" * 200_000, ":1: line longer than 100,000 bytes"),  # with the bound lowered below
    (b"[1, 2]\n", ":1: a task record must be a JSON object"),
])
def test_hostile_task_files_are_refused_naming_file_and_line(tmp_path, monkeypatch, content, match):
    monkeypatch.setattr("intellect_node.node.tasks.schema.MAX_TASK_LINE_BYTES", 100_000)
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(content)
    with pytest.raises(TaskSpecError, match=match) as caught:
        load_task_spec(str(path))
    assert str(path) in str(caught.value)


def test_a_directory_as_task_file_is_refused(tmp_path):
    with pytest.raises(TaskSpecError, match="Is a directory"):
        load_task_spec(str(tmp_path))
