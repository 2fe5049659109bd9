"""End to end over the 1,797 digits given as a folder, a CSV list, a Parquet manifest and a
COCO JSON: the same predictions; kill -9 then --resume exact for the manifests."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from runs import config, fast_sim

from batchinfer import run
from batchinfer.data.sources import open_source
from batchinfer.results import read_predictions

pytestmark = pytest.mark.slow


def write_lists(kit_dataset: Path, where: Path) -> dict[str, Path]:
    """The kit's digits as a CSV list (paths relative to it, labels), a Parquet manifest
    (ids and a carried column) and a COCO JSON (image root: the folder)."""
    items = list(open_source(kit_dataset))
    where.mkdir(parents=True, exist_ok=True)
    with open(where / "digits.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "split"])
        w.writerows([os.path.relpath(kit_dataset / i.id, where), i.label, "val"] for i in items)
    pq.write_table(
        pa.table({"path": [str(kit_dataset / i.id) for i in items], "id": [i.id for i in items],
                  "label": [i.label for i in items], "n": list(range(len(items)))}),
        where / "digits.parquet",
    )  # fmt: skip
    coco = {"images": [{"id": n + 1, "file_name": i.id} for n, i in enumerate(items)]}
    (where / "coco.json").write_text(json.dumps(coco))
    assert len(items) == 1797
    return {
        "csv": where / "digits.csv",
        "parquet": where / "digits.parquet",
        "coco": where / "coco.json",
    }


def _preds(out: Path) -> dict[str, tuple]:
    table = read_predictions(out).sort_by("index").to_pylist()
    return {
        r["id"].rsplit("/", 2)[-2] + "/" + r["id"].rsplit("/", 1)[-1]: (
            r["pred"],
            tuple(r["topk_index"]),
            tuple(round(s, 6) for s in r["topk_score"]),
        )
        for r in table
    }


def test_the_digits_give_the_same_predictions_as_folder_csv_parquet_and_coco(demo_kit, tmp_path):
    lists = write_lists(demo_kit.dataset, tmp_path / "lists")
    model = demo_kit.models["digits"]
    results = {}
    for name, dataset, extra in [
        ("folder", demo_kit.dataset, {}),
        ("csv", lists["csv"], {}),
        ("parquet", lists["parquet"], {}),
        ("coco", lists["coco"], {"image_root": demo_kit.dataset}),
    ]:
        out = tmp_path / name
        cfg = config(dataset, model, backend="sim", sim=fast_sim(npu_ms=0.0), out=out)
        if extra:
            import dataclasses

            cfg = dataclasses.replace(cfg, **extra)
        result = run(cfg)
        assert (result.status, result.succeeded, result.errors) == ("complete", 1797, 0)
        results[name] = _preds(out)
    assert len(results["folder"]) == 1797
    for name in ("csv", "parquet", "coco"):
        assert results[name] == results["folder"], name
    labels = {r["id"]: r["label"] for r in read_predictions(tmp_path / "csv").to_pylist()}
    folder = {r["id"]: r["label"] for r in read_predictions(tmp_path / "folder").to_pylist()}
    assert {"/".join(k.rsplit("/", 2)[-2:]): v for k, v in labels.items()} == folder
    meta = read_predictions(tmp_path / "parquet").sort_by("index")["meta"].to_pylist()
    assert [m["n"] for m in meta] == list(range(1797))


def _start(dataset: Path, model: Path, out: Path, *extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "batchinfer", "run", str(dataset), "--model", str(model),
        "--backend", "sim", "--sim-npu-ms", "3", "--sim-host-ms", "0", "--cores", "0",
        "--out", str(out), "--no-progress", "--part-rows", "40", *extra,
    ]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("form", ["csv", "parquet", "coco", "glob"])
def test_kill_9_then_resume_is_exact_for_a_manifest(demo_kit, tmp_path, form):
    lists = write_lists(demo_kit.dataset, tmp_path / "lists")
    lists["glob"] = demo_kit.dataset / "*" / "*.png"
    dataset = lists[form]
    extra = ["--image-root", str(demo_kit.dataset)] if form == "coco" else []
    model, out = demo_kit.models["digits"], tmp_path / "o"
    proc = _start(dataset, model, out, *extra)
    deadline = time.monotonic() + 120
    while len(list((out / "predictions").glob("part-*.parquet"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.02)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.kill()
    proc.communicate(timeout=30)
    psutil.wait_procs(children, timeout=30)
    written = read_predictions(out).num_rows
    assert 0 < written < 1797
    done = subprocess.run(
        [sys.executable, "-m", "batchinfer", "run", str(dataset), "--model", str(model),
         "--backend", "sim", "--sim-npu-ms", "0.2", "--sim-host-ms", "0", "--out", str(out),
         "--resume", "--no-progress", *extra],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"{written} already done (resumed)" in done.stdout
    table = read_predictions(out)
    assert sorted(table["index"].to_pylist()) == list(range(1797))
    assert len(set(table["id"].to_pylist())) == 1797
    assert table["error"].null_count == 1797
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"


def test_eval_scores_a_csv_list_with_labels_as_it_scores_the_class_folders(
    demo_kit, tmp_path, monkeypatch
):
    import re
    import shutil

    from test_eval_end_to_end import Workspace

    from batchinfer.evaluate import evaluate, load_job

    monkeypatch.setenv("BATCHINFER_SIM_NPU_MS", "0.2")
    monkeypatch.setenv("BATCHINFER_SIM_HOST_MS", "0")
    kit = tmp_path / "kit"
    (kit / "dataset").mkdir(parents=True)
    (kit / "models").symlink_to(demo_kit.root / "models")
    lines = ["path,label"]
    for folder in sorted(demo_kit.dataset.iterdir()):
        (kit / "dataset" / folder.name).mkdir()
        for png in sorted(folder.glob("*.png"))[:20]:
            shutil.copy(png, kit / "dataset" / folder.name / png.name)
            lines.append(f"dataset/{folder.name}/{png.name},{folder.name}")
    (kit / "val.csv").write_text("\n".join(lines) + "\n")
    ws = Workspace(tmp_path / "ws", kit)
    text = re.sub(r"(\[gates\.[a-z_0-9]+\][^\[]*)", "", ws.job.read_text())  # no gates
    ws.job.write_text(text)
    folder = evaluate(load_job(ws.job))
    ws.job.write_text(text.replace('path = "../demo/dataset"', 'path = "../demo/val.csv"'))
    listed = evaluate(load_job(ws.job))
    assert folder.metrics["top1"] == listed.metrics["top1"] < 1.0
    a = pq.read_table(folder.record_dir / "items.parquet").to_pylist()
    b = pq.read_table(listed.record_dir / "items.parquet").to_pylist()
    assert [(r["label"], r["pred"]) for r in a] == [(r["label"], r["pred"]) for r in b]
    assert len(b) == 200
