"""Per-class tables are sized by the model's classes, never by the largest label (issue 40
#3): a two-row list with the labels 0 and 2,000,000,000, or a class folder named
2000000000, took ``eval`` past 5 GB (a name per integer up to the label, then a square
confusion matrix of that side). A label outside the model's classes is counted and said.

What could blow memory before the fix runs in a child under an address-space limit.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_eval_metrics import items

from batchinfer.evaluate.metrics import score
from batchinfer.evaluate.scorers.classify_metrics import (
    EvalInputs,
    builtin_metrics,
    class_counts,
)

REPO = Path(__file__).resolve().parents[1]
HUGE = 2_000_000_000
CAP = 1_500_000_000  # bytes of address space: eval needs about a third of it


def capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def child(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, preexec_fn=capped, capture_output=True,
        text=True, timeout=timeout, check=False,
    )  # fmt: skip


def test_the_tables_are_the_models_classes_and_a_huge_label_is_counted_outside():
    device = items([0, HUGE, 2, 2], [[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.1, 0.2, 0.7], None])
    x = EvalInputs(device, topk=3)
    assert x.n_classes == 3  # the model's three outputs, not HUGE + 1
    assert (x.outside.items, x.outside.distinct, x.outside.first) == (1, 1, [HUGE])
    assert "1 labelled item(s) have a label outside the model's 3 classes (0-2): 2000000000" in (
        x.outside.sentence()
    )
    total, correct, _ = class_counts(device, x.n_classes)
    assert total.tolist() == [1, 0, 2] and correct.tolist() == [1, 0, 1]
    values = score(x, builtin_metrics(3), [])
    assert values["top1"] == pytest.approx(2 / 4)  # the outside label counts as wrong
    assert values["class_top1_min"] == pytest.approx(0.5)


def test_named_classes_beyond_the_outputs_stay_classes_and_none_outside_is_silent():
    device = items([0, 3], [[0.9, 0.1], [0.2, 0.8]])
    x = EvalInputs(device, classes=("a", "b", "c", "d"), topk=3)
    assert x.n_classes == 4 and x.outside.items == 0 and x.outside.sentence() == ""


def test_a_class_folder_named_2000000000_makes_two_class_names_not_two_billion(tmp_path):
    for folder in ("0", str(HUGE)):
        (tmp_path / "ds" / folder).mkdir(parents=True)
        Image.new("L", (8, 8)).save(tmp_path / "ds" / folder / "a.png")
    (tmp_path / "m.onnx").write_bytes(b"placeholder")
    (tmp_path / "job.toml").write_text('[device]\nmodel = "m.onnx"\n[dataset]\npath = "ds"\n')
    script = textwrap.dedent(
        """
        from pathlib import Path
        from batchinfer.data.folder import open_dataset
        from batchinfer.evaluate import load_job
        from batchinfer.evaluate.evaluation import class_map
        names, _, source = class_map(load_job(Path("job.toml")), open_dataset(Path("ds")))
        print(list(names), source["source"])
        """
    )
    done = child(["-c", script], tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['0', '1'] folders"


@pytest.mark.slow  # an evaluation end to end (the device run): about 30 s here
def test_eval_of_a_list_labelled_0_and_2000000000_stays_small_and_says_so(tmp_path, demo_kit):
    (tmp_path / "imgs").mkdir()
    first, second = sorted(demo_kit.dataset.glob("*/*.png"))[:2]
    (tmp_path / "imgs" / "a.png").write_bytes(first.read_bytes())
    (tmp_path / "imgs" / "b.png").write_bytes(second.read_bytes())
    (tmp_path / "list.csv").write_text(f"path,label\nimgs/a.png,0\nimgs/b.png,{HUGE}\n")
    model = demo_kit.root / "models" / "digits.onnx"
    (tmp_path / "job.toml").write_text(
        f'name = "huge"\n[device]\nmodel = "{model}"\n[device.runtime]\nbackend = "onnx"\n'
        'cores = [0]\n[dataset]\npath = "list.csv"\n[output]\ndir = "out"\n'
    )
    done = child(["-m", "batchinfer", "eval", "job.toml", "--no-progress"], tmp_path, 300)
    assert done.returncode == 0, done.stderr[-2000:]
    said = "1 labelled item(s) have a label outside the model's 10 classes (0-9): 2000000000"
    assert said in done.stderr and f"Warning: {said}" in done.stdout
    (path,) = (tmp_path / "out" / "evals").glob("*/result.json")
    record = json.loads(path.read_text())
    assert len(record["per_class"]) == 10 and np.shape(record["confusion"]) == (10, 10)
    assert record["labels_outside"] == {"items": 1, "distinct": 1, "first": [HUGE], "classes": 10}
    assert "id=labels-outside" in (tmp_path / "out" / "report.html").read_text()
