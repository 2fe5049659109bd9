"""Decoding a frame range through an ``ffmpeg`` binary (``--decoder ffmpeg``).

The same contract as :func:`batchinfer.data.video.decode.decode_range` (the wanted frames
in order, then at most one DecodeFailure), with the decoding done by an ``ffmpeg`` child
process writing raw RGB frames (``-f rawvideo -pix_fmt rgb24``) to a pipe. Its use is a
decoder PyAV's bundled FFmpeg does not have: on a Rockchip board, ffmpeg-rockchip
(github.com/nyanmisaka/ffmpeg-rockchip) decodes H.264/HEVC/VP9/AV1 on the VPU with
``-hwaccel rkmpp``, given as the extra input arguments::

    decode_range_ffmpeg(info, rng, extra_args=["-hwaccel", "rkmpp"])

which runs (for a range starting at a keyframe at 10.0 s, 300 frames)::

    ffmpeg -hide_banner -nostdin -loglevel error -hwaccel rkmpp -noautorotate \\
        -ss 9.991667 -i clip.mp4 -map 0:v:0 -frames:v 300 -fps_mode passthrough \\
        -f rawvideo -pix_fmt rgb24 pipe:1

The VPU decodes to NV12 in system memory and ffmpeg converts it to RGB on the CPU
(``-hwaccel_output_format drm_prime`` with ffmpeg-rockchip's ``scale_rkrga`` filter could
do that conversion on the RGA too; not tried here). Check that the build has the decoders
with ``ffmpeg -hide_banner -decoders | grep rkmpp``. Frames come out turned as PyAV's are:
a video the probe found a display rotation in (:attr:`~.probe.VideoInfo.rotation`) is left
to ffmpeg's own autorotate (which turns it the same way: the probe's size is the turned
frame's), any other keeps its stored orientation (``-noautorotate``).

The range starts with ``-ss`` a quarter frame before its keyframe, with ffmpeg's accurate
seek: ffmpeg seeks to the keyframe before that point (sometimes the one before ours, which
costs a GOP of decoding) and drops every frame earlier than it, so the first frame out is
our keyframe whatever the container's index precision. Frames are then counted from it.

Where it differs from PyAV: a picture size that changes mid-stream is scaled by ffmpeg to
the first size (its ``-autoscale`` default; raw frames have no header to say otherwise),
where PyAV's decode ends the range with a failure; and a file that cannot seek (a raw
``.h264`` dump, not a video extension batchinfer lists) gives no frame after its first
range, where PyAV reads it from the start.

The child is killed and reaped when the generator is closed, fails or ends: no leaked
process, even when the caller stops part way.
"""

from __future__ import annotations

import fcntl
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence

import numpy as np

from batchinfer.data.video.decode import DecodedFrame, DecodeFailure, _short_file
from batchinfer.data.video.plan import FrameRange
from batchinfer.data.video.probe import VideoInfo
from batchinfer.errors import RuntimeUnavailableError

_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux's fcntl command number

# The "[h264 @ 0x55d0c0a8e600] " that starts an FFmpeg log line.
_PREFIX = re.compile(r"^\[[^\]]* @ 0x[0-9a-f]+\]\s*")


def ffmpeg_binary(binary: str = "ffmpeg") -> str:
    """The path of ``binary``, or RuntimeUnavailableError saying how to get one."""
    found = shutil.which(binary)
    if found is None:
        raise RuntimeUnavailableError(
            f"The ffmpeg decoder needs an {binary} program on PATH: install one "
            "(apt-get install ffmpeg; ffmpeg-rockchip on a Rockchip board) or use the PyAV decoder."
        )
    return found


def ffmpeg_command(
    info: VideoInfo, rng: FrameRange, extra_args: Sequence[str] = (), binary: str = "ffmpeg"
) -> list[str]:
    """The ffmpeg command that writes frames ``rng.seek`` to ``rng.until - 1`` as raw RGB."""
    if rng.keyframes_only:
        count = int(
            np.searchsorted(info.keyframes, rng.until) - np.searchsorted(info.keyframes, rng.seek)
        )
    else:
        count = rng.until - rng.seek
    cmd = [binary, "-hide_banner", "-nostdin", "-loglevel", "error", *extra_args]
    if not info.rotation:
        # The probe's size is the coded one: ffmpeg must not turn a frame the probe did not
        # (a display matrix read without autorotate, or one ffmpeg reads and PyAV does not).
        cmd += ["-noautorotate"]
    if rng.keyframes_only:
        cmd += ["-skip_frame", "nokey"]
    if rng.seek > 0:
        step = 1 / info.fps if info.fps > 0 else 0.001
        at = float(info.pts[rng.seek] * info.time_base) - info.container_start_s - step / 4
        cmd += ["-ss", f"{max(at, 0.0):.6f}"]
    cmd += ["-i", info.path, "-map", "0:v:0", "-frames:v", str(count), "-fps_mode", "passthrough"]
    if rng.keyframes_only:
        # Not every decoder honours skip_frame (FFV1 puts out every frame): keep keyframes.
        cmd += ["-vf", "select=key"]
    return [*cmd, "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"]


def decode_range_ffmpeg(
    info: VideoInfo, rng: FrameRange, extra_args: Sequence[str] = (), binary: str = "ffmpeg"
) -> Iterator[DecodedFrame | DecodeFailure]:
    """Yield the wanted frames of ``rng`` decoded by an ``ffmpeg`` child, then at most one
    DecodeFailure (a short pipe, or ffmpeg's exit status and first error line)."""
    wanted = rng.wanted
    if not len(wanted):
        if rng.stop == info.frames and info.damaged_at is not None:
            yield DecodeFailure(
                info.path, info.damaged_at, _short_file(info), np.array([info.damaged_at])
            )
        return
    cmd = ffmpeg_command(info, rng, extra_args, ffmpeg_binary(binary))
    # The frames' indices, in the order ffmpeg writes them.
    indices = (
        info.keyframes[(info.keyframes >= rng.seek) & (info.keyframes < rng.until)]
        if rng.keyframes_only
        else None
    )
    frame_bytes = info.width * info.height * 3
    delivered = 0
    reason = ""
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors, bufsize=0
        )
        assert proc.stdout is not None
        _widen(proc.stdout.fileno(), frame_bytes)
        try:
            k = 0
            while delivered < len(wanted):
                data = bytearray(frame_bytes)  # each frame its own buffer: it is yielded
                if _read_into(proc.stdout, data) < frame_bytes:
                    break
                index = int(indices[k]) if indices is not None else rng.seek + k
                k += 1
                if index == wanted[delivered]:
                    rgb = np.frombuffer(data, dtype=np.uint8).reshape(info.height, info.width, 3)
                    yield DecodedFrame(index, float(info.time_s(index)), rgb)
                    delivered += 1
        finally:
            _stop(proc)
        if delivered < len(wanted):
            errors.seek(0)
            said = errors.read(4096).decode("utf-8", "replace").strip().splitlines()
            status = proc.returncode
            reason = (
                _PREFIX.sub("", said[0]).rstrip(".")
                if said
                else f"ffmpeg stopped (exit status {status})"
            )
    if rng.stop == info.frames and info.damaged_at is not None:
        reason = (reason + "; " if reason else "") + _short_file(info)
    if delivered < len(wanted):
        yield DecodeFailure(info.path, int(wanted[delivered]), reason, wanted[delivered:])
    elif rng.stop == info.frames and info.damaged_at is not None:
        yield DecodeFailure(info.path, info.damaged_at, reason, np.array([info.damaged_at]))


def _read_into(pipe, buffer: bytearray) -> int:
    """Fill ``buffer`` from ``pipe``; the bytes read (fewer only at its end)."""
    view = memoryview(buffer)
    done = 0
    while done < len(buffer):
        got = pipe.readinto(view[done:])
        if not got:
            break
        done += got
    return done


def _widen(fd: int, frame_bytes: int) -> None:
    """Make the pipe hold a whole frame if the system allows (Linux's default is 64 KiB:
    a 640x480 frame would take 15 wake-ups of each side, each a wait for a CPU on a busy
    machine)."""
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            most = int(f.read())
        fcntl.fcntl(fd, _F_SETPIPE_SZ, min(frame_bytes, most))
    except (OSError, ValueError):
        pass  # not Linux, or not allowed: the default size works, more slowly


def _stop(proc: subprocess.Popen) -> None:
    """Kill ``proc`` if it still runs (the caller stopped early) and reap it."""
    if proc.poll() is None:
        proc.kill()
    if proc.stdout is not None:
        proc.stdout.close()
    proc.wait()
