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
