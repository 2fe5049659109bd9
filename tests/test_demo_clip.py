"""The demo clip: four held-out digits moving in their lanes, honest boxes, written as an
H.264 clip with the same boxes as COCO (``<clip>#<frame>``) and MOT (1-based) ground truth."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("av")

from batchinfer.data.video.probe import probe
from batchinfer.demo import clip
from batchinfer.demo.detection import INK_ALPHA
from batchinfer.demo.digits import test_split


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return clip.write_demo_clip(tmp_path_factory.mktemp("clip"), frames=90)


def test_the_digits_are_four_different_held_out_ones_in_their_own_lanes():
    paths = clip.tracks()
    assert len({t.label for t in paths}) == clip.TRACKS == 4
    assert set(t.digit for t in paths) <= set(test_split().tolist())
    for frame in range(0, clip.FRAMES, 7):
        boxes = clip.clip_scene(frame, paths).boxes
        assert (boxes[:, :2] >= 0).all() and (boxes[:, 2] <= clip.WIDTH).all()
        assert (boxes[:, 3] <= clip.HEIGHT).all()
        # lanes: each box below the one before (no two digits overlap)
        assert (boxes[1:, 1] >= boxes[:-1, 3]).all()


def test_boxes_are_tight_around_the_ink_drawn_and_the_digits_move():
    a, b = clip.clip_scene(40), clip.clip_scene(41)
    assert not np.array_equal(a.boxes, b.boxes) and not np.array_equal(a.image, b.image)
    assert np.array_equal(clip.clip_scene(40).image, a.image)  # made from the seed alone
    background = clip.clip_scene(40, paths=[]).image.astype(np.float32)
    # how far each pixel went from the background towards the ink colour: the ink's alpha
    full = clip._INK - background
    alpha = ((a.image - background) * full).sum(axis=2) / (full * full).sum(axis=2)
    for x1, y1, x2, y2 in a.boxes.astype(int):
        inside = np.zeros_like(alpha, dtype=bool)
        inside[y1:y2, x1:x2] = True
        lane = np.zeros_like(inside)
        lane[max(y1 - 6, 0) : y2 + 6] = True
        strong = (alpha > INK_ALPHA + 0.05) & lane
        assert not (strong & ~inside).any()  # no ink of this digit outside its box
        edges = alpha[y1:y2, x1:x2] > INK_ALPHA - 0.05
        assert edges[0].any() and edges[-1].any() and edges[:, 0].any() and edges[:, -1].any()


def test_the_written_clip_has_every_frame_at_30_fps(written):
    info = probe(str(written.video))
    assert info.frames == 90 and (info.width, info.height) == (clip.WIDTH, clip.HEIGHT)
    assert info.fps == pytest.approx(clip.FPS)
    assert written.boxes == 90 * clip.TRACKS


def test_coco_and_mot_ground_truth_say_the_same(written):
    coco = json.loads(written.instances.read_text())
    ids = {i["id"]: i["file_name"] for i in coco["images"]}
    assert [ids[k] for k in sorted(ids)] == [f"digits.mp4#{f}" for f in range(90)]
    from_coco = sorted(
        (int(ids[a["image_id"]].rsplit("#", 1)[1]), a["category_id"], *map(int, a["bbox"]))
        for a in coco["annotations"]
    )
    from_mot = []
    for line in written.mot.read_text().splitlines():
        frame, track, x, y, w, h, flag, cls, _vis = (int(float(v)) for v in line.split(","))
        assert 1 <= track <= clip.TRACKS and flag == 1 and frame >= 1
        from_mot.append((frame - 1, cls - 1, x, y, w, h))  # both 1-based in MOT
    assert sorted(from_mot) == from_coco
    scene = clip.clip_scene(17)
    pairs = zip(scene.labels, scene.boxes, strict=True)
    want = sorted((17, int(c), *map(int, b)) for c, b in pairs)
    got = [(f, c, x, y, x + w, y + h) for f, c, x, y, w, h in sorted(from_mot) if f == 17]
    assert sorted(got) == want
