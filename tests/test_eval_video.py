"""Eval on video: ground truth per frame from a COCO JSON naming ``<video>#<frame>`` or a MOT
``gt.txt`` (1-based frames and classes), matched against every frame but scored on the
sampled ones; the shipped nightly job over the demo clip (slow)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_cli import invoke

pytest.importorskip("av")

from batchinfer.data.coco_file import GroundTruthError
from batchinfer.data.sources import open_source
from batchinfer.data.video.dataset import VideoSettings
from batchinfer.data.video.plan import Sampling
from batchinfer.demo.clip import write_demo_clip
from batchinfer.evaluate.video_truth import read_video_truth

REPO = Path(__file__).resolve().parents[1]
FRAMES = 30


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return write_demo_clip(tmp_path_factory.mktemp("clip"), frames=FRAMES)


def sampled(clip, every: int = 3):
    return open_source(clip.video, video=VideoSettings(Sampling(every=every)))


def boxes(gt) -> list[tuple]:
    """(item, category, bbox ints, crowd) of every annotation."""
    item = {i["id"]: i["file_name"] for i in gt.images}
    return sorted(
        (item[a["image_id"]], a["category_id"], *map(round, a["bbox"]), a["iscrowd"])
        for a in gt.annotations
    )


def test_coco_and_mot_give_the_same_frames_and_boxes_scored_on_the_sampled_frames(clip):
    dataset = sampled(clip)
    coco = read_video_truth(clip.instances, dataset, None)
    mot = read_video_truth(clip.mot, dataset, None)
    wanted = [f"digits.mp4#{f}" for f in range(0, FRAMES, 3)]
    for gt in (coco, mot):
        assert sorted(gt.image_ids, key=lambda i: int(i.split("#")[1])) == wanted
        # the frames not sampled are matched, not unknown, and not scored
        assert gt.unknown_images == () and gt.dropped_annotations == 0
        assert gt.unmatched_items == ()
        assert [c.name for c in gt.categories] == [str(d) for d in range(10)]
        assert len(gt.annotations) == 4 * len(wanted)
    assert boxes(coco) == boxes(mot)
    assert coco.source["format"] == "coco" and mot.source["format"] == "mot"


def test_scored_frames_limit_what_is_scored(clip):
    dataset = sampled(clip, every=1)
    gt = read_video_truth(clip.mot, dataset, {"digits.mp4#0", "digits.mp4#7"})
    assert sorted(gt.image_ids.values()) == [1, 8]  # image id = MOT's 1-based frame
    assert {b[0] for b in boxes(gt)} == {"digits.mp4#0", "digits.mp4#7"}


def test_mot_frames_past_the_video_are_unknown_and_conf_0_is_ignored(clip, tmp_path):
    folder = tmp_path / "gt"
    folder.mkdir()
    shutil.copy(clip.mot.parent / "labels.txt", folder / "labels.txt")
    lines = clip.mot.read_text().splitlines()
    frame, track, x, y, w, h, _, cls, vis = lines[0].split(",")
    lines[0] = ",".join([frame, track, x, y, w, h, "0", cls, vis])  # ignore this one
    lines.append(f"{FRAMES + 5},1,1,1,10,10,1,1,1")  # a frame the clip does not have
    (folder / "gt.txt").write_text("\n".join(lines) + "\n")
    gt = read_video_truth(folder / "gt.txt", sampled(clip), None)
    assert gt.unknown_images == (f"digits.mp4#{FRAMES + 4}",) and gt.dropped_annotations == 1
    crowd = [b for b in boxes(gt) if b[-1] == 1]
    assert len(crowd) == 1 and crowd[0][0] == "digits.mp4#0"


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("0,1,1,1,10,10,1,1,1", "MOT counts frames from 1"),
        ("1,1,1,1,10,10,1,11,1", "names class 11"),
        ("1,1,1,1", "is not 'frame,id,x,y,w,h"),
        ("1;1;1;1;10;10", "comma-separated"),
    ],
)
def test_a_bad_mot_line_is_named(clip, tmp_path, line, needle):
    (tmp_path / "labels.txt").write_text("".join(f"{d}\n" for d in range(10)))
    (tmp_path / "gt.txt").write_text(line + "\n")
    with pytest.raises(GroundTruthError, match=needle) as caught:
        read_video_truth(tmp_path / "gt.txt", sampled(clip), None)
    assert "line 1" in str(caught.value)


def test_mot_without_labels_uses_the_model_names_and_needs_one_video(clip, tmp_path):
    shutil.copy(clip.mot, tmp_path / "gt.txt")
    gt = read_video_truth(tmp_path / "gt.txt", sampled(clip), None, names=list("abcdefghij"))
    assert [c.name for c in gt.categories] == list("abcdefghij")
    videos = tmp_path / "videos"
    videos.mkdir()
    shutil.copy(clip.video, videos / "a.mp4")
    shutil.copy(clip.video, videos / "b.mp4")
    with pytest.raises(GroundTruthError, match="describes one video; the dataset holds 2"):
        read_video_truth(tmp_path / "gt.txt", open_source(videos), None)


def test_coco_for_a_folder_of_videos_matches_each_by_its_id(clip, tmp_path):
    videos = tmp_path / "videos"
    videos.mkdir()
    shutil.copy(clip.video, videos / "a.mp4")
    shutil.copy(clip.video, videos / "b.mp4")
    coco = json.loads(clip.instances.read_text())
    for image in coco["images"]:
        image["file_name"] = image["file_name"].replace("digits.mp4", "b.mp4")
    (tmp_path / "b.json").write_text(json.dumps(coco))
    gt = read_video_truth(tmp_path / "b.json", sampled_folder(videos), None)
    assert {i.split("#")[0] for i in gt.image_ids} == {"b.mp4"} and len(gt.image_ids) == 10
    assert len(gt.unmatched_items) == 10  # a.mp4's frames: no ground truth, not scored


def sampled_folder(folder: Path):
    return open_source(folder, video=VideoSettings(Sampling(every=3)))


@pytest.mark.slow
def test_the_shipped_clip_job_passes_on_the_demo_clip(demo_kit, tmp_path, monkeypatch):
    """jobs/detect-digits-clip.toml as shipped: every 3rd of the 300 frames, MOT ground
    truth; the detector finds every digit (mAP@0.5 1.0 measured; floor 0.95 here)."""
    monkeypatch.setenv("BATCHINFER_SIM_NPU_MS", "0.2")
    monkeypatch.setenv("BATCHINFER_SIM_HOST_MS", "0")
    (tmp_path / "jobs").mkdir()
    shutil.copy(REPO / "jobs" / "detect-digits-clip.toml", tmp_path / "jobs")
    (tmp_path / "demo").symlink_to(demo_kit.root)
    result = invoke("eval", tmp_path / "jobs" / "detect-digits-clip.toml", "--no-progress")
    assert result.exit_code == 0, result.output
    (path,) = (tmp_path / "eval" / "detect-digits-clip" / "evals").glob("*/result.json")
    record = json.loads(path.read_text())
    assert record["ground_truth"]["format"] == "mot" and record["ground_truth"]["images"] == 100
    assert record["ground_truth"]["unknown_images"] == 0
    assert record["metrics"]["map50"] >= 0.95 and record["metrics"]["errors"] == 0


def test_an_evaluation_opens_a_video_with_the_device_side_sampling(demo_kit, clip, tmp_path):
    """evaluate/steps.py opened the dataset without the video settings: every frame."""
    from batchinfer.evaluate.job import load_job
    from batchinfer.evaluate.steps import open_job_dataset

    job = tmp_path / "job.toml"
    job.write_text(
        f'name = "clip"\ntask = "detect"\n[device]\nmodel = "{demo_kit.models["digits-det"]}"\n'
        f'[device.preprocess]\nevery = 7\n[dataset]\npath = "{clip.video}"\n'
        f'ground_truth = "{clip.mot}"\n[output]\ndir = "{tmp_path / "out"}"\n'
    )
    dataset = open_job_dataset(load_job(job))
    assert [i.id for i in dataset] == [f"digits.mp4#{f}" for f in range(0, FRAMES, 7)]


def test_paths_of_finds_every_frame_asked_of_one_video(clip):
    """VideoDataset.paths_of kept one frame id per video: the report found the video file
    of one of the gallery's frames only."""
    dataset = sampled(clip)
    ids = ["digits.mp4#0", "digits.mp4#3", "digits.mp4#27", "other.mp4#0"]
    assert dataset.paths_of(ids) == {i: str(clip.video) for i in ids[:3]}
