"""Video files as datasets: each decoded frame one item (issue 42). The data layer only.

Modules: :mod:`.probe` (what a file holds, by demuxing; refusals), :mod:`.plan`
(sampling and keyframe ranges), :mod:`.decode` (PyAV), :mod:`.ffmpeg_pipe` (an ``ffmpeg``
child, ``--decoder ffmpeg``), :mod:`.ids` (frame ids, the resume fingerprint),
:mod:`.clip` (a generated clip of moving digits for tests, benchmarks and the demo kit).
PyAV is the optional ``video`` extra (``pip install batchinfer[video]``); it is imported
only when a function needs it.

How it is wired into ``run`` (:mod:`.dataset`: the items; :mod:`.frames`: the readers' side;
the plan below is what was built, with the differences said there):

1. **Source.** The sources dispatch recognises :data:`.probe.VIDEO_EXTENSIONS` (a file, a
   folder of videos in sorted order, a list file, a glob; a folder mixing images and
   videos is refused as mixed kinds are today). For each video the coordinator calls
   :func:`.probe.probe` with ``max_pixels`` and the frame cap (demux only, cheap), and
   :func:`.plan.plan_ranges` with the run's :class:`.plan.Sampling` and
   ``parts = readers x a few`` (more ranges than readers balances the load). A refused
   probe is one error row (``<video id>#0``, the InputError's message). The work units are
   ``(video, range)`` pairs; their items are the range's ``wanted`` frames, ids from
   :func:`.ids.frame_id`. The manifest records each video's :func:`.ids.fingerprint` and
   the sampling; ``--resume`` refuses a video whose fingerprint changed, and skips frame
   ids already written, so a range partly done before a crash is re-decoded from its
   keyframe and only its missing frames are fed.
2. **Readers.** A reader given a range runs :func:`.decode.decode_range` (or
   :func:`.ffmpeg_pipe.decode_range_ffmpeg` with ``--decoder ffmpeg`` and the extra
   arguments setting, e.g. ``-hwaccel rkmpp`` on a board with ffmpeg-rockchip; the
   coordinator checks :func:`.ffmpeg_pipe.ffmpeg_binary` before the run starts) and,
   for each :class:`.decode.DecodedFrame`, fills a slot the way an
   image is filled: the RGB array goes through the model's own preprocessing (resize or
   letterbox, channels, mean/std) instead of a file decode. Ranges travel to readers as
   (path, start, stop, seek, until, keyframes_only, wanted) plus the probe's pts table
   for that range, or the reader probes again (cheap) and checks the fingerprint.
3. **Rows.** Each frame's row gets ``frame`` (int64, :attr:`.decode.DecodedFrame.index`)
   and ``time_s`` (float64, seconds from the video's first frame). A
   :class:`.decode.DecodeFailure` becomes one error row at ``<video id>#<frame>`` with its
   message; the other frames it lists (``missing``) are done with no row of their own, or
   each an error row, as the exactly-once rule of the run decides. The run goes on with
   the other ranges and videos.

Frame indices are the order the decoder puts frames out (presentation order), 0-based per
video; sampling and ranges never change a frame's index.
"""

from __future__ import annotations

from batchinfer.data.video.decode import DecodedFrame, DecodeFailure, decode_range
from batchinfer.data.video.ids import fingerprint, frame_id, split_frame_id
from batchinfer.data.video.plan import FrameRange, Sampling, plan_ranges, wanted_frames
from batchinfer.data.video.probe import VIDEO_EXTENSIONS, VideoInfo, probe

__all__ = [
    "VIDEO_EXTENSIONS",
    "DecodeFailure",
    "DecodedFrame",
    "FrameRange",
    "Sampling",
    "VideoInfo",
    "decode_range",
    "fingerprint",
    "frame_id",
    "plan_ranges",
    "probe",
    "split_frame_id",
    "wanted_frames",
]
