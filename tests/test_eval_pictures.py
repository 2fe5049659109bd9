"""The eval report's pictures of the worst and flipped items for datasets whose ids are not
paths under a folder: a CSV list with an ``id`` column, tar-shard members
(batchinfer.evaluate.evaluation, report, thumbnails)."""

from __future__ import annotations

import base64
import io
import re
import shutil
from pathlib import Path

import pytest
from PIL import Image
from tar_shards import write_shards

pytest.importorskip("matplotlib")
pytestmark = pytest.mark.slow


@pytest.fixture
def quick_sim(monkeypatch):
    monkeypatch.setenv("BATCHINFER_SIM_NPU_MS", "0.2")
    monkeypatch.setenv("BATCHINFER_SIM_HOST_MS", "0")


def _kit(demo_kit, root: Path, per_class: int) -> Path:
    """A demo kit with ``per_class`` images of each class and a list of them with ids."""
    kit = root / "kit"
    (kit / "dataset").mkdir(parents=True)
    (kit / "models").symlink_to(demo_kit.root / "models")
    for folder in sorted(demo_kit.dataset.iterdir()):
        (kit / "dataset" / folder.name).mkdir()
        for png in sorted(folder.glob("*.png"))[:per_class]:
            shutil.copy(png, kit / "dataset" / folder.name / png.name)
    return kit


def _write_list(kit: Path, relabel: int = 0) -> None:
    """val.csv: path,id,label; the first ``relabel`` rows get a wrong label."""
    lines = ["path,id,label"]
    for n, png in enumerate(sorted((kit / "dataset").glob("*/*.png"))):
        label = int(png.parent.name)
        label = (label + 1) % 10 if n < relabel else label
        lines.append(f"dataset/{png.parent.name}/{png.name},img-{n:04d},{label}")
    (kit / "val.csv").write_text("\n".join(lines) + "\n")


def _job(root: Path, kit: Path, dataset: str) -> Path:
    from test_eval_end_to_end import Workspace

    ws = Workspace(root / "ws", kit)
    text = re.sub(r"(\[gates\.[a-z_0-9]+\][^\[]*)", "", ws.job.read_text())  # no gates
    ws.job.write_text(text.replace('path = "../demo/dataset"', f'path = "../demo/{dataset}"'))
    return ws.job


def _pictures(page: str) -> dict[str, bytes]:
    """Item id -> its picture's PNG bytes, for every card of the page with a picture."""
    found = re.findall(r"<img alt='([^']*)' src='data:image/png;base64,([^']*)'>", page)
    return {ident: base64.b64decode(data) for ident, data in found}


def _drawn(png: bytes) -> bool:
    with Image.open(io.BytesIO(png)) as image:
        low, high = image.convert("L").getextrema()
        return image.size[0] > 0 and high > low  # a digit, not a blank


def test_a_lists_worst_and_flipped_items_have_pictures(demo_kit, tmp_path, quick_sim):
    from batchinfer.evaluate import evaluate, load_job

    kit = _kit(demo_kit, tmp_path, 5)
    _write_list(kit)
    job = _job(tmp_path, kit, "val.csv")
    evaluate(load_job(job), update_baseline=True)
    _write_list(kit, relabel=4)  # four items the model got right now have wrong labels
    night2 = evaluate(load_job(job))
    page = (night2.record_dir / "report.html").read_text()
    pictures = _pictures(page)
    lost = night2.record["flipped"]["lost"]
    assert lost and all(i.startswith("img-") for i in lost)
    assert set(lost) <= pictures.keys()
    worst = [item["id"] for item in night2.record["worst"]]
    assert worst and set(worst) <= pictures.keys()
    assert all(_drawn(png) for png in pictures.values())
    assert "no picture" not in page


def test_the_worst_items_of_a_tar_shard_set_have_pictures(demo_kit, tmp_path, quick_sim):
    from batchinfer.evaluate import evaluate, load_job

    kit = _kit(demo_kit, tmp_path, 5)
    write_shards(kit / "dataset", kit / "shards", 2)
    job = _job(tmp_path, kit, "shards/part-{000..001}.tar")
    night = evaluate(load_job(job))
    page = (night.record_dir / "report.html").read_text()
    pictures = _pictures(page)
    worst = [item["id"] for item in night.record["worst"]]
    assert worst and set(worst) <= pictures.keys()
    assert all(_drawn(png) for png in pictures.values())
    assert "no picture" not in page
