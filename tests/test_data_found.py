"""A list or COCO JSON read against the wrong folder is refused before the run, naming the
folder its files look to be in (batchinfer.data.found)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from runs import config, fast_sim
from test_cli import assert_error, invoke, run_args

from batchinfer import run
from batchinfer.cli.options import flag_of
from batchinfer.data.found import PROBE, check_some_exist
from batchinfer.data.sources import open_source
from batchinfer.engine.planning.plan import plan_run
from batchinfer.errors import DatasetError
from batchinfer.evaluate.job import job_key


def _images(folder: Path, names: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        Image.fromarray(np.full((8, 8), i * 20, np.uint8)).save(folder / name)


def _coco(path: Path, names: list[str]) -> Path:
    images = [{"id": i, "file_name": name} for i, name in enumerate(names)]
    path.write_text(json.dumps({"images": images}))
    return path


def test_a_coco_json_beside_its_images_folder_is_refused_naming_the_folder(tmp_path, demo_kit):
    # The demo's layout (detection/instances.json beside detection/images/): run without
    # --image-root, it once made one "No such file" error row per image.
    names = [f"{i:05d}.png" for i in range(8)]
    _images(tmp_path / "images", names)
    ann = _coco(tmp_path / "instances.json", names)
    out = tmp_path / "o"
    result = invoke(*run_args(ann, demo_kit.models["digits"], out))
    line = assert_error(result, 2, "--image-root", str(tmp_path / "images"), str(ann))
    assert f"None of the first {PROBE} files" in line
    assert not out.exists()
    # Given the folder it named, the same run reads every image.
    result = invoke(*run_args(ann, demo_kit.models["digits"], out, "--image-root",
                              tmp_path / "images"))  # fmt: skip
    assert result.exit_code == 0, result.output


def test_cocos_own_layout_finds_the_images_beside_the_annotations_folder(tmp_path):
    # annotations/instances_val2017.json next to val2017/: one level up from the JSON.
    _images(tmp_path / "val2017", ["1.png", "2.png"])
    (tmp_path / "annotations").mkdir()
    ann = _coco(tmp_path / "annotations" / "instances.json", ["2.png", "1.png"])
    ds = open_source(ann)
    with pytest.raises(DatasetError) as caught:
        ds.check_found()
    said = caught.value.render(flag_of)
    assert said.startswith(f"None of the first 2 files the COCO file {ann} names exists under")
    assert f"they look to be in {tmp_path / 'val2017'}: give it as --image-root." in said
    assert caught.value.render(lambda f: job_key("device", f)).endswith(
        "give it as dataset.image_root."
    )
    open_source(ann, image_root=tmp_path / "val2017").check_found()  # found: no error


def test_no_folder_is_guessed_unless_it_holds_every_file_looked_for(tmp_path):
    # One file of a common name in some folder is no evidence that the list's files are there.
    # (In a folder of its own: the folders beside tmp_path are other tests', holding both.)
    _images(tmp_path / "ds" / "other", ["a.png"])
    (tmp_path / "ds" / "lists").mkdir()
    lst = tmp_path / "ds" / "lists" / "val.txt"
    lst.write_text("a.png\nb.png\n")
    with pytest.raises(DatasetError) as caught:
        open_source(lst).check_found()
    said = caught.value.render(flag_of)
    assert "None of the first 2 files the list" in said
    assert "look to be in" not in said
    assert said.endswith("give the folder they are in as --image-root.")


def test_absolute_paths_that_are_missing_say_to_check_the_list(tmp_path):
    lst = tmp_path / "val.txt"
    lst.write_text(f"{tmp_path / 'gone' / 'a.png'}\n")
    with pytest.raises(DatasetError, match=r"\(/.*a\.png\); check the paths it holds"):
        open_source(lst).check_found()


def test_only_the_first_files_are_looked_for(tmp_path):
    # A list of millions on slow storage: a miss among the first PROBE, then a file that
    # exists, is a run (with an error row for the miss); PROBE misses are a refusal, even
    # when a later file exists.
    _images(tmp_path, ["late.png"])
    lst = tmp_path / "val.txt"
    lst.write_text("".join(f"gone{i}.png\n" for i in range(PROBE - 1)) + "late.png\n")
    open_source(lst).check_found()
    lst.write_text("".join(f"gone{i}.png\n" for i in range(PROBE)) + "late.png\n")
    with pytest.raises(DatasetError):
        open_source(lst).check_found()
    looked: list[str] = []

    def paths():
        for i in range(10 * PROBE):
            looked.append(f"gone{i}.png")
            yield looked[-1]

    with pytest.raises(DatasetError):
        check_some_exist("txt", str(lst), str(tmp_path), paths())
    assert len(looked) == PROBE


def test_a_run_whose_first_files_are_missing_but_later_ones_exist_makes_error_rows(
    tmp_path, demo_kit
):
    files = sorted((demo_kit.dataset / "3").glob("*.png"))[:2]
    lst = tmp_path / "m.txt"
    lst.write_text("gone.png\n" + "".join(f"{f}\n" for f in files))
    result = run(config(lst, demo_kit.models["digits"], backend="sim", sim=fast_sim(),
                        out=tmp_path / "o"))  # fmt: skip
    assert (result.status, result.succeeded, result.errors) == ("complete", 2, 1)


def test_rows_that_name_no_file_count_neither_as_found_nor_as_missing(tmp_path):
    # A row without a path is its own error row: PROBE of them before a file that exists
    # are no refusal, and one before PROBE missing files is no file found (the list's
    # folder itself exists: joined with an empty path, it once passed for a file).
    _images(tmp_path, ["a.png"])
    lst = tmp_path / "m.csv"
    lst.write_text("path\n" + '""\n' * PROBE + "a.png\n")
    open_source(lst).check_found()
    lst.write_text('path\n""\n' + "".join(f"gone{i}.png\n" for i in range(PROBE)))
    with pytest.raises(DatasetError, match=f"None of the first {PROBE} files"):
        open_source(lst).check_found()


def test_a_plan_for_files_read_elsewhere_does_not_look_for_them(tmp_path, demo_kit):
    # --ray-data shared: the nodes read the files (each is asked for the first), and the
    # machine that plans the run need not mount them.
    ann = _coco(tmp_path / "instances.json", ["on-the-nodes.png"])
    cfg = config(ann, demo_kit.models["digits"], backend="sim", out=tmp_path / "o")
    with pytest.raises(DatasetError, match=r"The first file the COCO file .* does not exist under"):
        plan_run(cfg)
    assert len(plan_run(cfg, files_here=False).dataset) == 1


def test_a_data_yaml_whose_files_are_elsewhere_says_to_check_its_path_key(tmp_path):
    # Its paths start at its path: key, which --image-root does not move: naming that flag
    # sent the user to an option that is refused with a data.yaml.
    _images(tmp_path / "ds" / "images" / "val", ["a.png", "b.png"])
    (tmp_path / "ds" / "val.txt").write_text("val/a.png\nval/b.png\n")
    spec = tmp_path / "ds.yaml"
    spec.write_text("path: ds\nval: val.txt\n")
    with pytest.raises(DatasetError) as caught:
        open_source(spec).check_found()
    said = caught.value.render(flag_of)
    assert f"(they look to be in {tmp_path / 'ds' / 'images'})" in said
    assert said.endswith("check its path: key and its val split.")
    assert "--image-root" not in said


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (lambda p: p, "is a folder"),
        (lambda p: str(p / "*.png"), "is a glob"),
        (lambda p: (p / "d.yaml").write_text("val: .\n") and p / "d.yaml", "is a data.yaml"),
    ],
)
def test_an_image_root_that_cannot_move_the_datasets_paths_is_refused(tmp_path, make, what):
    # It was ignored: a user who gave it believed the run read their images from there.
    _images(tmp_path, ["a.png"])
    with pytest.raises(DatasetError) as caught:
        open_source(make(tmp_path), image_root=tmp_path)
    said = caught.value.render(flag_of)
    assert said.startswith("--image-root moves the relative paths of a list file or a COCO")
    assert what in said and said.endswith("so leave it out.")


def test_bench_takes_an_image_root_for_a_coco_dataset(tmp_path, demo_kit):
    # bench --dataset took a COCO JSON but had no --image-root: the refusal above named a
    # flag bench did not have, and before it the benchmark measured error rows.
    from batchinfer.bench.runner import BenchConfig, prepare

    names = [f"{i:05d}.png" for i in range(6)]
    _images(tmp_path / "images", names)
    ann = _coco(tmp_path / "instances.json", names)
    model = demo_kit.models["digits"]
    result = invoke("bench", "--model", model, "--dataset", ann, "--backend", "sim")
    assert_error(result, 2, "give it as --image-root")
    config = BenchConfig(model=model, dataset=ann, image_root=tmp_path / "images")
    prepared = prepare(config)
    assert prepared.dataset is not None
    assert [item.path for item in prepared.dataset] == [str(tmp_path / "images" / n) for n in names]
    result = invoke("bench", "--compare", ann, ann, "--image-root", tmp_path)
    assert_error(result, 2, "drop --image-root")
