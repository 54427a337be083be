"""Every finetune config file loads through the config system and names a registered task; each GLUE task has
its own `configs/finetune/<task>.py` (the CLI contract `--config=configs/finetune/<task>.py`)."""

import glob
import os

import pytest

from xlgen import config as config_lib
from xlgen.finetune.tasks import TASKS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = sorted(
    p
    for p in glob.glob(os.path.join(ROOT, "configs", "finetune", "*.py"))
    if os.path.basename(p) not in ("__init__.py", "common.py")
)


@pytest.mark.parametrize("path", FILES, ids=[os.path.basename(p) for p in FILES])
def test_finetune_config_loads_and_names_a_task(path):
    c = config_lib.load_config(path, {"data_dir": "/nonexistent"})
    assert c.task in TASKS, f"{path}: task {c.task!r} is not registered"
    assert c.data_dir == "/nonexistent"


def test_every_glue_task_has_a_config_file():
    names = {os.path.basename(p)[:-3] for p in FILES}
    for task in (t for t in TASKS if t.startswith("glue/")):
        assert task.split("/")[1] in names, f"configs/finetune/{task.split('/')[1]}.py is missing"
