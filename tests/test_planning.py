"""run, infer, bench and eval plan through one path (engine/planning/plan.py's plan_inference):
the backend, the model's input, the engine's plan, the dataset and its feeds."""

from __future__ import annotations

from pathlib import Path

import models as M
import pytest
from PIL import Image
from runs import config

from batchinfer.engine.planning import plan
from batchinfer.options import RuntimeOptions


@pytest.fixture
def images(tmp_path) -> Path:
    data = tmp_path / "d" / "a"
    data.mkdir(parents=True)
    for i in range(3):
        Image.new("RGB", (8, 8), (i, i, i)).save(data / f"{i}.png")
    return data.parent


@pytest.fixture
def backends_made(monkeypatch) -> list[Path]:
    """The model of every backend made through the planning path."""
    made: list[Path] = []
    real = plan.make_backend

    def recorded(model, runtime):
        made.append(Path(model))
        return real(model, runtime)

    monkeypatch.setattr(plan, "make_backend", recorded)
    return made


def test_run_infer_bench_and_eval_make_their_backend_through_the_one_planning_path(
    tmp_path, images, backends_made
):
    from batchinfer.api import _plan_paths
    from batchinfer.bench.runner import BenchConfig, prepare
    from batchinfer.data.folder import open_dataset
    from batchinfer.evaluate import load_job
    from batchinfer.evaluate.runs import plan_side

    model = M.nhwc_uint8_model(tmp_path)
    cfg = config(images, model, backend="onnx", out=tmp_path / "o")

    run = plan.plan_run(cfg)
    engine, _, _ = _plan_paths(cfg, [str(p) for p in sorted(images.rglob("*.png"))])
    bench = prepare(
        BenchConfig(model=model, runtime=RuntimeOptions(backend="onnx"), dataset=images)
    )
    job_file = tmp_path / "job.toml"
    job_file.write_text(
        f'[device]\nmodel = "{model.name}"\n[device.runtime]\nbackend = "onnx"\n'
        f'[dataset]\npath = "{images.name}"\n'
    )
    job = load_job(job_file)
    side = plan_side(job, "device", job.device, open_dataset(job.dataset.path))

    assert [p.name for p in backends_made] == [model.name] * 4
    plans = [run.engine, engine, bench.plan, side.engine]
    # The same checks and defaults: the same preprocessing for the same model and data.
    assert len({p.preprocess for p in plans}) == 1
    assert {p.backend.name for p in plans} == {"onnx"}


def test_a_missing_model_is_one_sentence_whoever_plans(tmp_path, images):
    from batchinfer.bench.runner import BenchConfig, prepare
    from batchinfer.errors import ModelError

    missing = tmp_path / "nope.onnx"
    with pytest.raises(ModelError, match="does not exist"):
        plan.plan_run(config(images, missing, out=tmp_path / "o"))
    with pytest.raises(ModelError, match="does not exist"):
        prepare(BenchConfig(model=missing, dataset=images))
