"""Soak test of ``batchinfer run`` under injected faults (a tool, not part of pytest).

Pushes N items (default 20,000 tiny uint8 tensors) through ``digits.onnx`` on the sim
backend with a crash, hang or ``None`` fault every 300-700 calls on each core, then checks
what the engine promises:

- exactly once: every index 0..N-1 appears in exactly one prediction row;
- error rows only where two injected faults hit the same item (normally none);
- the exit code matches the rows (0 no error rows, 1 some; 130 after SIGINT);
- every worker restart follows a crash/hang fault on its core, every such fault is answered
  by a restart, and core_stats counts the restarts the coordinator warned about;
- after SIGINT: exit 130, a resume hint, the manifest says interrupted and every row it
  counts is on disk;
- no ``batchinfer-*`` segment of our coordinators left in /dev/shm, no child process left,
  no temp folder left (the runs get their own TMPDIR so this can be checked).

Modes (one per invocation):
    python tools/soak.py                      # one run with faults
    python tools/soak.py --interrupt          # SIGINT mid-run (as Ctrl-C: the process
                                              # group), then --resume
    python tools/soak.py --kill               # SIGKILL the coordinator mid-run, wait for
                                              # its children, then --resume
Use ``--workdir DIR`` to keep the dataset between invocations (it takes a while to write).
Prints a summary; exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import pyarrow.parquet as pq

from batchinfer.demo import make_npy_dataset, model_path
from batchinfer.engine.slots import SEGMENT_PREFIX, SHM_DIR
from batchinfer.sink.predictions import PART_GLOB, PREDICTIONS_DIR

CORES = 3
FAULT_KINDS = ("crash", "hang", "none")
_FIRED_RE = re.compile(r"injected fault ((crash|hang|none):core=(\d+):call=(\d+))")
# The coordinator's warning when a worker died or was killed (see _on_worker_exit).
_DEATH_RE = re.compile(r"^warning: core (\d+)(?:: .*; restarting it in | retired after )")


# --------------------------------------------------------------------------------- set-up
def fault_plan(items: int, gap: tuple[int, int], seed: int) -> list[str]:
    """Fault specs for every core: kinds in turn, call numbers spaced ``gap`` apart.

    Faults stop at 85 % of a core's fair share of calls, so that a core slowed down by its
    restarts still reaches (nearly) all of its faults.
    """
    rng = np.random.default_rng(seed)
    last = int(0.85 * items / CORES)
    specs = []
    for core in range(CORES):
        turn = int(rng.integers(len(FAULT_KINDS)))
        call = int(rng.integers(gap[0], gap[1] + 1))
        while call <= last:
            specs.append(f"{FAULT_KINDS[turn % len(FAULT_KINDS)]}:core={core}:call={call}")
            turn += 1
            call += int(rng.integers(gap[0], gap[1] + 1))
    return specs


def ensure_dataset(folder: Path, items: int) -> float:
    """Write ``items`` (1,8,8,1) uint8 tensors to ``folder`` unless already there; seconds spent."""
    if folder.is_dir() and sum(1 for _ in folder.glob("*.npy")) == items:
        return 0.0
    t0 = time.monotonic()
    make_npy_dataset(folder, items, shape=(1, 8, 8, 1), overwrite=True)
    return time.monotonic() - t0


# ------------------------------------------------------------------------------ one run
@dataclass
class RunRecord:
    """What one ``batchinfer run`` subprocess did, as seen from outside."""

    name: str
    pid: int = 0
    exit_code: int | None = None
    wall_s: float = 0.0
    stdout: str = ""
    stderr_lines: list[str] = field(default_factory=list)
    descendants: dict[int, float] = field(default_factory=dict)  # pid -> create_time

    def fired(self) -> list[tuple[str, int]]:
        """(kind, core) of every injected fault that fired in this run, from the sim's E/W lines."""
        return [(m[2], int(m[3])) for line in self.stderr_lines if (m := _FIRED_RE.search(line))]


class RunWatcher:
    """Starts one run in its own session, drains its stderr, records its descendants."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.rec = RunRecord(name)
        self.started = threading.Event()
        self.log_path = log_dir / f"{name}.stderr.log"
        self.t0 = time.monotonic()
        # A session of its own: SIGINT can go to the whole group, as a terminal's Ctrl-C does.
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.rec.pid = self.proc.pid
        self._done = threading.Event()
        self._threads = [
            threading.Thread(target=self._read_stderr, daemon=True),
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._watch_children, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read_stderr(self) -> None:
        with open(self.log_path, "w") as log:
            for line in self.proc.stderr:
                log.write(line)
                self.rec.stderr_lines.append(line.rstrip("\n"))
                if line.startswith("started:"):
                    self.started.set()

    def _read_stdout(self) -> None:
        self.rec.stdout = self.proc.stdout.read()

    def _watch_children(self) -> None:
        # Polled, not evented: a worker lives at least its start-up (~1 s), far above 0.1 s.
        try:
            coord = psutil.Process(self.proc.pid)
        except psutil.Error:
            return
        while not self._done.is_set():
            try:
                for child in coord.children(recursive=True):
                    self.rec.descendants.setdefault(child.pid, child.create_time())
            except psutil.Error:
                return
            self._done.wait(0.1)

    def wait(self, timeout: float) -> RunRecord:
        """Wait for the run to end (kill it after ``timeout`` s) and return its record."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.rec.exit_code = self.proc.returncode
        self.rec.wall_s = time.monotonic() - self.t0
        self._done.set()
        for t in self._threads:
            t.join(10)
        return self.rec


def alive_descendants(rec: RunRecord) -> list[int]:
    """Pids recorded as the run's descendants that still exist (the same process, not a reuse)."""
    alive = []
    for pid, created in rec.descendants.items():
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 0.01 and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            pass
    return alive


def segments_of(pids: set[int]) -> list[str]:
    """The /dev/shm segments named after one of ``pids`` (batchinfer-<pid>-...)."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    return sorted(
        n
        for n in names
        if n.startswith(SEGMENT_PREFIX + "-") and n.split("-")[1].isdigit()
        if int(n.split("-")[1]) in pids
    )


# ----------------------------------------------------------------------------- checking
@dataclass
class Soak:
    """The state of one soak invocation: where things are, what was seen, what went wrong."""

    args: argparse.Namespace
    work: Path
    dataset: Path
    out: Path
    tmp: Path
    faults: list[str]
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)

    def check(self, ok: bool, what: str) -> bool:
        if not ok:
            self.violations.append(what)
            print(f"  VIOLATION: {what}")
        return ok

    def argv(self, *extra: str) -> list[str]:
        a = self.args
        argv = [
            sys.executable,
            "-m",
            "batchinfer",
            "run",
            str(self.dataset),
            "--model",
            str(model_path("digits")),
            "--backend",
            "sim",
            "--sim-npu-ms",
            str(a.npu_ms),
            "--sim-host-ms",
            str(a.host_ms),
            "-k",
            str(a.k),
            "--timeout-s",
            str(a.timeout_s),
            "--part-rows",
            str(a.part_rows),
            "--out",
            str(self.out),
            "--no-progress",
        ]
        for spec in self.faults:
            argv += ["--sim-fault", spec]
        return argv + list(extra)

    def start(self, name: str, *extra: str) -> RunWatcher:
        env = dict(os.environ, TMPDIR=str(self.tmp))
        print(f"[{name}] starting: batchinfer run ... {' '.join(extra)}".rstrip())
        return RunWatcher(name, self.argv(*extra), env, self.work)

    def parts(self) -> list[Path]:
        return sorted((self.out / PREDICTIONS_DIR).glob(PART_GLOB))

    def wait_for_progress(self, watcher: RunWatcher, fraction: float) -> bool:
        """Wait until the run said ``started:`` and has written ``fraction`` of the parts."""
        want = max(2, int(fraction * self.args.items / self.args.part_rows))
        deadline = time.monotonic() + self.args.run_timeout_s
        if not watcher.started.wait(self.args.run_timeout_s):
            return False
        while time.monotonic() < deadline:
            if watcher.proc.poll() is not None:
                return False
            if len(self.parts()) >= want:
                return True
            time.sleep(0.05)  # polling a folder: there is no event to await
        return False

    def finish(self, watcher: RunWatcher) -> RunRecord:
        rec = watcher.wait(self.args.run_timeout_s)
        self.runs.append(rec)
        fired = rec.fired()
        kinds = {k: sum(1 for f, _ in fired if f == k) for k in FAULT_KINDS}
        print(
            f"[{rec.name}] exit {rec.exit_code} after {rec.wall_s:.1f} s; faults fired: "
            + ", ".join(f"{k} {v}" for k, v in kinds.items())
            + f" (of {len(self.faults)} planned); {len(rec.descendants)} child processes seen"
        )
        if rec.exit_code not in (0, 130, -signal.SIGKILL):
            print(f"[{rec.name}] stdout:\n{rec.stdout}")
        return rec

    def check_clean(self, rec: RunRecord, grace_s: float = 10.0) -> None:
        """No descendant left (after ``grace_s``), no segment of this coordinator in /dev/shm."""
        deadline = time.monotonic() + grace_s
        left = alive_descendants(rec)
        while left and time.monotonic() < deadline:
            time.sleep(0.1)  # orphans of a killed coordinator: nothing of ours to wait on
            left = alive_descendants(rec)
        if self.check(not left, f"[{rec.name}] processes left behind: {left}"):
            print(f"[{rec.name}] no child process left ({len(rec.descendants)} seen)")
        for pid in left:
            kill_leftover(pid)
        segs = segments_of({rec.pid})
        self.check(not segs, f"[{rec.name}] segments left in {SHM_DIR}: {segs}")

    def tmp_left(self) -> list[str]:
        # onnxruntime keeps a session-id file (.ses) in the temp dir by design: not a leak.
        return sorted(p.name for p in self.tmp.iterdir() if p.name != ".ses")

    def check_tmp_empty(self, rec: RunRecord) -> None:
        left = self.tmp_left()
        self.check(not left, f"[{rec.name}] temp files left in the run's TMPDIR: {left}")

    def check_stopped_run(self, rec: RunRecord) -> None:
        """After SIGINT: the manifest says interrupted and every row it counts is on disk."""
        manifest = json.loads((self.out / "manifest.json").read_text())
        rows = sum(pq.read_metadata(p).num_rows for p in self.parts())
        written = manifest["counts"]["written"]
        print(f"[{rec.name}] manifest: {manifest['status']}, {written} written; {rows} on disk")
        self.check(manifest["status"] == "interrupted", f"[{rec.name}] manifest {manifest}")
        self.check(rows == written, f"[{rec.name}] {rows} rows on disk, manifest says {written}")
        self.check_stats(rec, drained=True)

    def check_stats(self, rec: RunRecord, drained: bool = False) -> None:
        """Restarts: each one follows a crash/hang fault on its core, each such fault has one.

        With k instances a worker whose first instance hangs keeps inferring on the others
        until it is killed, so more faults can fire in that same process: one restart may
        answer several faults. The check walks the run's stderr in order, per core: a restart
        warning must come after at least one crash/hang fault since the previous restart, and
        no such fault may be left without a restart at the end. core_stats must count the
        restart warnings. ``drained``: the run was stopped, and a worker that faulted while
        the coordinator drained is stopped without a restart, so faults may be left over.
        """
        pending = dict.fromkeys(range(CORES), 0)
        deaths = dict.fromkeys(range(CORES), 0)
        for line in rec.stderr_lines:
            if (m := _FIRED_RE.search(line)) and m[2] in ("crash", "hang"):
                pending[int(m[3])] += 1
            elif m := _DEATH_RE.match(line):
                core = int(m[1])
                deaths[core] += 1
                self.check(pending[core] > 0, f"[{rec.name}] restart without a fault: {line}")
                pending[core] = 0
                if "retired" in line:
                    self.check(False, f"[{rec.name}] a core was retired: {line}")
        self.check(
            drained or not any(pending.values()),
            f"[{rec.name}] crash/hang faults not followed by a restart, per core: {pending}",
        )
        stats = pq.read_table(self.out / "core_stats.parquet").to_pylist()
        restarts = {r["core"]: r["restarts"] for r in stats if r["core"] is not None}
        print(f"[{rec.name}] restarts per core {restarts}; restart warnings {deaths}")
        self.check(
            restarts == deaths,
            f"[{rec.name}] core_stats restarts {restarts} differ from the warnings {deaths}",
        )

    def check_rows(self, final: RunRecord, fired: int | None = None) -> None:
        """Exactly once over every part, error rows explained, exit code consistent.

        With ``fired`` (the faults that fired, when one run wrote every row) also: every
        fault charged the item it fired on one attempt, and at most the k items inside
        inference() in that worker, so fired <= attempts charged <= k * fired.
        """
        n = self.args.items
        tables = [pq.read_table(p, columns=["index", "error", "attempt"]) for p in self.parts()]
        index = np.concatenate([t["index"].to_numpy() for t in tables]) if tables else np.array([])
        errors = [e for t in tables for e in t["error"].to_pylist() if e is not None]
        attempts = np.concatenate([t["attempt"].to_numpy() for t in tables]) if tables else index
        outside = int(((index < 0) | (index >= n)).sum())
        counts = np.bincount(index[(index >= 0) & (index < n)].astype(np.int64), minlength=n)
        missing, dup = int((counts == 0).sum()), int((counts > 1).sum())
        print(
            f"[check] {len(index)} rows in {len(tables)} parts: {missing} missing, {dup} "
            f"duplicated, {outside} out of range; {len(errors)} error rows; "
            f"{int((attempts > 1).sum())} rows needed a retry"
        )
        self.check(missing == 0 and dup == 0 and outside == 0, "exactly-once violated")
        if fired is not None:
            failed = np.concatenate(
                [t["error"].is_valid().to_numpy(zero_copy_only=False) for t in tables]
            )
            charged = int((attempts - 1)[~failed].sum() + attempts[failed].sum())
            print(f"[check] {charged} attempts charged for {fired} faults fired")
            most = self.args.k * fired
            self.check(
                fired <= charged <= most,
                f"{charged} attempts charged for {fired} faults (expected {fired}..{most})",
            )
        if missing or dup:
            bad = np.nonzero(counts != 1)[0][:10].tolist()
            self.notes.append(f"first indices not exactly once: {bad}")
        for e in errors:
            # Only an item that met an injected fault on each of its attempts may fail.
            symptoms = ("crashed", "hung", "returned None")
            # A failure reads "core C: reason"; a reason may itself contain "; ".
            failures = re.split(r"; (?=core \d+: )", e)
            explained = len(failures) >= self.args.max_attempts and all(
                any(s in part for s in symptoms) for part in failures
            )
            self.check(explained, f"unexplained error row: {e}")
        leftovers = list((self.out / PREDICTIONS_DIR).glob(".part-*.tmp"))
        self.check(not leftovers, f"temporary part files left: {leftovers}")
        want = 1 if errors else 0
        self.check(
            final.exit_code == want,
            f"[{final.name}] exit code {final.exit_code}, expected {want} for {len(errors)} "
            "error rows",
        )
        last = final.stdout.strip().splitlines()[-1] if final.stdout.strip() else ""
        self.check(last.startswith("complete:"), f"[{final.name}] last line is {last!r}")


def kill_leftover(pid: int) -> None:
    """SIGKILL a process the run left behind (so the soak itself leaves nothing)."""
    with contextlib.suppress(psutil.Error):
        psutil.Process(pid).kill()


# -------------------------------------------------------------------------------- modes
def mode_plain(s: Soak) -> None:
    rec = s.finish(s.start("run"))
    s.check_clean(rec)
    s.check_tmp_empty(rec)
    s.check_stats(rec)
    s.check_rows(rec, fired=len(rec.fired()))


def mode_interrupt(s: Soak) -> None:
    w = s.start("run")
    if not s.check(s.wait_for_progress(w, s.args.at), "run ended before it could be interrupted"):
        s.finish(w)
        return
    parts_then = len(s.parts())
    os.killpg(w.proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    print(f"[run] SIGINT to the process group with {parts_then} parts on disk")
    rec = s.finish(w)
    s.check(rec.exit_code == 130, f"[run] exit code {rec.exit_code} after SIGINT, expected 130")
    s.check(
        any("resume with:" in line for line in rec.stderr_lines),
        "[run] no 'resume with:' hint on stderr after SIGINT",
    )
    s.check_clean(rec)
    s.check_tmp_empty(rec)
    s.check_stopped_run(rec)
    resumed = s.finish(s.start("resume", "--resume"))
    s.check_clean(resumed)
    s.check_tmp_empty(resumed)
    s.check_stats(resumed)
    s.check_rows(resumed)
    print(f"[resume] {resumed.stdout.strip().splitlines()[-1] if resumed.stdout else ''}")


def mode_kill(s: Soak) -> None:
    w = s.start("run")
    if not s.check(s.wait_for_progress(w, s.args.at), "run ended before it could be killed"):
        s.finish(w)
        return
    # Kill just after a hang fires when one comes soon: a worker stuck inside inference()
    # is the hardest child to get rid of.
    hangs = sum(1 for k, _ in w.rec.fired() if k == "hang")
    deadline = time.monotonic() + 2 * s.args.timeout_s
    while time.monotonic() < deadline and w.proc.poll() is None:
        if sum(1 for k, _ in w.rec.fired() if k == "hang") > hangs:
            print("[run] a worker has just hung")
            break
        time.sleep(0.01)  # watching another thread's list of lines: no event to await
    parts_then = len(s.parts())
    os.kill(w.proc.pid, signal.SIGKILL)
    print(f"[run] SIGKILL to the coordinator (pid {w.proc.pid}) with {parts_then} parts on disk")
    rec = s.finish(w)
    t0 = time.monotonic()
    s.check_clean(rec, grace_s=s.args.orphan_grace_s)
    print(f"[run] children gone {time.monotonic() - t0:.1f} s after the coordinator was reaped")
    left_tmp = s.tmp_left()
    if left_tmp:  # SIGKILL leaves no chance to clean up; the next run does not sweep these
        s.notes.append(f"after SIGKILL the run's temp folders stay: {left_tmp}")
        for p in s.tmp.iterdir():
            shutil.rmtree(p, ignore_errors=True)
    resumed = s.finish(s.start("resume", "--resume"))
    s.check_clean(resumed)
    s.check(not segments_of({rec.pid}), "segments of the killed coordinator still there")
    s.check_tmp_empty(resumed)
    s.check_stats(resumed)
    s.check_rows(resumed)
    print(f"[resume] {resumed.stdout.strip().splitlines()[-1] if resumed.stdout else ''}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--interrupt", action="store_true", help="SIGINT mid-run, then --resume")
    mode.add_argument("--kill", action="store_true", help="SIGKILL mid-run, then --resume")
    p.add_argument("--items", type=int, default=20000)
    p.add_argument("--workdir", type=Path, help="keep the dataset here (default: a temp dir)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gap", default="300,700", help="calls between faults on a core: LOW,HIGH")
    p.add_argument("--no-faults", action="store_true")
    p.add_argument("-k", type=int, default=2, help="instances per core")
    p.add_argument("--npu-ms", type=float, default=0.3)
    p.add_argument("--host-ms", type=float, default=0.2)
    p.add_argument("--timeout-s", type=float, default=2.0)
    p.add_argument("--max-attempts", type=int, default=2, help="the engine's default")
    p.add_argument("--part-rows", type=int, default=500)
    p.add_argument("--at", type=float, default=0.4, help="interrupt/kill when this share is done")
    p.add_argument("--orphan-grace-s", type=float, default=15.0)
    p.add_argument("--run-timeout-s", type=float, default=600.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run one soak mode; return 0 when every check held, 1 otherwise."""
    args = parse_args(argv)
    low, high = (int(v) for v in args.gap.split(","))
    own_work = args.workdir is None
    work = Path(tempfile.mkdtemp(prefix="batchinfer-soak-")) if own_work else args.workdir
    work.mkdir(parents=True, exist_ok=True)
    dataset = work / f"dataset-{args.items}"
    made_s = ensure_dataset(dataset, args.items)
    if made_s:
        print(f"wrote {args.items} tensors to {dataset} in {made_s:.1f} s")
    mode = "interrupt" if args.interrupt else "kill" if args.kill else "plain"
    out, tmp = work / f"out-{mode}", work / f"tmp-{mode}"
    for d in (out, tmp):
        shutil.rmtree(d, ignore_errors=True)
    tmp.mkdir()
    faults = [] if args.no_faults else fault_plan(args.items, (low, high), args.seed)
    s = Soak(args, work, dataset, out, tmp, faults)
    print(
        f"soak ({mode}): {args.items} items, cores 0-{CORES - 1}, k={args.k}, "
        f"npu {args.npu_ms} ms, host {args.host_ms} ms, timeout {args.timeout_s} s, "
        f"{len(faults)} faults planned ({', '.join(faults[:3])}{', ...' if faults else ''})"
    )
    t0 = time.monotonic()
    {"plain": mode_plain, "interrupt": mode_interrupt, "kill": mode_kill}[mode](s)
    total = time.monotonic() - t0
    print(f"\nsummary ({mode}): {len(s.runs)} run(s) in {total:.1f} s")
    for r in s.runs:
        print(f"  {r.name}: exit {r.exit_code}, {r.wall_s:.1f} s, faults fired {len(r.fired())}")
    for note in s.notes:
        print(f"  note: {note}")
    if own_work and not s.violations:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"  stderr logs: {work}/*.stderr.log")
    if s.violations:
        print(f"FAILED: {len(s.violations)} violation(s)")
        for v in s.violations:
            print(f"  - {v}")
        return 1
    print("OK: every check held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
