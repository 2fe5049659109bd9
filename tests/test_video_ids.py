"""Frame ids and the per-video resume fingerprint."""

from __future__ import annotations

import pytest
from video_files import write_clip

from batchinfer.data.video import fingerprint, frame_id, probe, split_frame_id


def test_frame_ids_round_trip():
    assert frame_id("clips/a.mp4", 12) == "clips/a.mp4#12"
    assert split_frame_id("clips/a.mp4#12") == ("clips/a.mp4", 12)
    # A '#' in the video's own name: the frame is what follows the last one.
    assert split_frame_id(frame_id("take#2.mkv", 0)) == ("take#2.mkv", 0)
    for not_a_frame in ("a.jpg", "a.mp4#", "#3", "a.mp4#-1", "a.mp4#1.5", "a.mp4#٣"):
        assert split_frame_id(not_a_frame) is None, not_a_frame
    with pytest.raises(ValueError):
        frame_id("a.mp4", -1)


def test_the_fingerprint_changes_with_the_video(tmp_path):
    a = write_clip(tmp_path / "a.mkv", "lossless", 30, 64, 48)
    first = fingerprint(probe(a))
    assert first == {"size": a.stat().st_size, "duration_s": 1.0, "frames": 30}
    assert fingerprint(probe(a)) == first  # stable: what a resumed run compares
    write_clip(a, "lossless", 31, 64, 48)  # re-recorded under the same name
    again = fingerprint(probe(a))
    assert again["frames"] == 31 and again["duration_s"] == pytest.approx(31 / 30, abs=1e-3)
