"""The evaluation's runs: the reference cache and its fingerprint, the class map, a device
run that cannot start (exit 3) and one that is interrupted (130): neither records anything."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image
from test_eval_metrics import FIVE

from batchinfer.cli import main
from batchinfer.data.folder import open_dataset
from batchinfer.engine.events import RowsDone
from batchinfer.errors import RunInterrupted
from batchinfer.evaluate import JobError, evaluate, load_job
from batchinfer.evaluate.evaluation import class_map
from batchinfer.evaluate.runs import (
    dataset_stat_sha256,
    load_cached,
    sdk_versions,
    store_cached,
)


def images(root: Path, names: dict[str, int]) -> Path:
    """A dataset of tiny PNGs: ``{"cat/0.png": value, ...}``."""
    for name, value in names.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((8, 8), value, np.uint8)).save(path)
    return root


def test_the_reference_cache_answers_only_for_the_same_fingerprint(tmp_path):
    fingerprint = {"model_sha256": "ab" * 32, "dataset_listing_sha256": "cd" * 32}
    assert load_cached(tmp_path, fingerprint) is None
    store_cached(tmp_path, fingerprint, FIVE)
    cached = load_cached(tmp_path, fingerprint)
    assert cached is not None
    assert cached.pred.tolist() == FIVE.pred.tolist()
    assert cached.topk.tolist() == FIVE.topk.tolist()
    assert cached.error.tolist() == FIVE.error.tolist()
    np.testing.assert_array_equal(cached.outputs[0], FIVE.outputs[0])  # NaN rows included
    assert load_cached(tmp_path, {**fingerprint, "model_sha256": "ef" * 32}) is None


def test_a_file_replaced_under_the_same_name_changes_the_dataset_fingerprint(tmp_path):
    root = images(tmp_path / "ds", {"a/0.png": 0, "a/1.png": 50, "b/2.png": 100})
    before = dataset_stat_sha256(open_dataset(root), None)
    assert dataset_stat_sha256(open_dataset(root), None) == before
    assert dataset_stat_sha256(open_dataset(root), 2) != before  # the limit is part of it
    images(root, {"a/1.png": 51})
    os.utime(root / "a" / "1.png", ns=(1, 1))
    assert dataset_stat_sha256(open_dataset(root), None) != before


def test_sdk_banner_gives_runtime_and_driver_versions():
    banner = (
        "==========\nRKNN VERSION:\n  API: 2.5.0 (abc build@2025)\n  DRV: rknn_server: 2.5.0\n"
        "  DRV: rknnrt: 2.5.0\n=========="
    )
    assert sdk_versions(banner) == ("2.5.0 (abc build@2025)", "rknn_server: 2.5.0; rknnrt: 2.5.0")


def job_with(tmp_path: Path, dataset: Path, extra: str = "") -> Path:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"placeholder")
    path = tmp_path / "job.toml"
    path.write_text(f'[device]\nmodel = "{model}"\n[dataset]\npath = "{dataset}"\n{extra}')
    return path


def test_a_labels_file_maps_class_folders_by_name_or_number(tmp_path):
    root = images(tmp_path / "ds", {"cat/0.png": 0, "dog/1.png": 9, "2/2.png": 5})
    (tmp_path / "classes.txt").write_text("dog\ncat\nbird\n")
    job = load_job(job_with(tmp_path, root, 'labels = "classes.txt"\n'))
    classes, relabel, source = class_map(job, open_dataset(root))
    assert classes == ("dog", "cat", "bird")
    assert relabel == {"cat": 1, "dog": 0, "2": 2}
    assert source["source"] == "labels file" and len(source["sha256"]) == 64
    # Without the file, the folder names in sorted order are the classes.
    job = load_job(job_with(tmp_path, root))
    assert class_map(job, open_dataset(root))[:2] == (("2", "cat", "dog"), None)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("dog\n", "class folder 'cat' is neither a name in"),
        ("dog\n\ncat\n", r"has an empty line \(2\)"),
        ("dog\ncat\ndog\n", "names 'dog' twice"),
    ],
)
def test_a_labels_file_that_does_not_fit_is_a_job_error(tmp_path, text, needle):
    root = images(tmp_path / "ds", {"cat/0.png": 0, "dog/1.png": 9})
    (tmp_path / "classes.txt").write_text(text)
    job = load_job(job_with(tmp_path, root, 'labels = "classes.txt"\n'))
    with pytest.raises(JobError, match=needle) as caught:
        class_map(job, open_dataset(root))
    assert str(caught.value).startswith(f"{job.path}: dataset.labels")


def test_a_device_run_that_cannot_start_exits_3_and_records_nothing(tmp_path, demo_kit):
    job = tmp_path / "job.toml"
    job.write_text(
        f'[device]\nmodel = "{demo_kit.models["digits"]}"\n'
        '[device.runtime]\nbackend = "sim"\ncores = [0, 1]\n'
        '[device.runtime.sim]\nfaults = ["init:core=0", "init:core=1"]\n'
        f'[dataset]\npath = "{demo_kit.dataset}"\nlimit = 20\n'
    )
    result = CliRunner().invoke(main, ["eval", str(job), "--no-progress"])
    assert result.exit_code == 3, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.output
    assert str(job) in errors[0]
    assert not (tmp_path / "eval" / "job" / "history.parquet").exists()


class _InterruptOnFirstRows:
    """Sends this process SIGINT when the first rows arrive, as Ctrl-C would."""

    def __init__(self) -> None:
        self.sent = False

    def notify(self, event: object) -> None:
        if isinstance(event, RowsDone) and not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)


def test_an_interrupted_evaluation_records_nothing(tmp_path, demo_kit, monkeypatch):
    monkeypatch.setenv("BATCHINFER_SIM_NPU_MS", "2")
    monkeypatch.setenv("BATCHINFER_SIM_HOST_MS", "0")
    path = tmp_path / "job.toml"
    path.write_text(
        f'[device]\nmodel = "{demo_kit.models["digits"]}"\n'
        '[device.runtime]\nbackend = "sim"\ncores = [0]\n'
        f'[dataset]\npath = "{demo_kit.dataset}"\nlimit = 400\n'
    )
    job = load_job(path)
    interrupt = _InterruptOnFirstRows()
    with pytest.raises(RunInterrupted, match="nothing was recorded") as caught:
        evaluate(job, observers=lambda side: [interrupt])
    assert caught.value.exit_code == 130 and interrupt.sent
    assert not job.outputs.history.exists() and not job.outputs.evals.exists()


def test_a_classification_job_scores_a_multi_output_model_as_a_classifier(tmp_path):
    # run's auto makes such a model raw (outputs only, no top-1); a classification job
    # scores the first output's top-1 all the same.
    from models import two_output_model

    from batchinfer.evaluate.runs import plan_side

    (tmp_path / "data" / "a").mkdir(parents=True)
    np.save(tmp_path / "data" / "a" / "x.npy", np.arange(4, dtype=np.float32).reshape(1, 4))
    two_output_model(tmp_path)
    job_file = tmp_path / "job.toml"
    job_file.write_text(
        '[device]\nmodel = "two_output.onnx"\n[device.runtime]\nbackend = "onnx"\n'
        '[dataset]\npath = "data"\n'
    )
    job = load_job(job_file)
    plan = plan_side(job, "device", job.device, open_dataset(job.dataset.path))
    assert plan.engine.classifies and plan.engine.task.name == "classify"
