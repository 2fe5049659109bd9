"""Soak test of ``batchinfer run`` under injected faults (a tool, not part of pytest).

Pushes N items (default 20,000 tiny uint8 tensors) through ``digits.onnx`` on the sim
backend with a crash, hang or ``None`` fault every 300-700 calls on each core, plus the
faults of the chosen mode and options, then checks what the engine promises:

- exactly once: every index appears in exactly one prediction row;
- every error row is explained by an injected fault: a hanging file (stuck a reader on each
  of its attempts), a poison item (crashed its worker on each attempt), or an item that met
  a random fault on each of its attempts (normally none); with --poison, no other item
  fails;
- the exit code matches the rows (0 no error rows, 1 some; 130 after SIGINT; 2 for a run
  started on an --out another run holds);
- restarts match the faults: every worker restart answers a fault on its core (a crash or
  hang the emulator logged, a poison item's crash, a worker the soak froze), every such
  fault is answered, no core is ever retired, and core_stats counts the restarts the
  coordinator warned about; every reader restart names a hanging file;
- no ``Traceback``, ``BrokenPipeError`` or resource-tracker "leaked" warning on stderr;
- nothing left: no ``batchinfer-*`` segment of our coordinators in /dev/shm, no child
  process (readers, workers, the janitor, the resource tracker), no temp file (the runs get
  their own TMPDIR so this can be checked).

Modes (``--mode``, one per invocation):
    plain       one run
    interrupt   SIGINT to the run's process group mid-run (as Ctrl-C), then --resume
    kill        SIGKILL to the coordinator mid-run, then --resume. It waits for the hardest
                moment: with --fifos, a reader blocked in open() of a FIFO; else just after
                a worker hung inside inference()
    freeze      SIGSTOP one core worker mid-run (--freezes times): the watchdog must kill
                it as hung or frozen and restart it, and no item may be lost
    ctrl-z      SIGTSTP to the whole process group (what Ctrl-Z does) for --stop-s, longer
                than the inference timeout, then SIGCONT (--stops times): nobody may be
                killed, so this mode injects no other fault
    second-run  while the run works, start ``run`` on the same --out again, plain, with
                --resume and with --overwrite: each must exit 2 at once naming the holder's
                pid, leave nothing behind, and the first run must finish undisturbed
Options that add faults to any mode but ctrl-z:
    --fifos N   N symlinks named like items, spread over the dataset, pointing at a FIFO
                nobody writes (open() blocks for ever): exactly those become error rows, and
                N > 10 proves they do not use up the reader-death limit (10)
    --poison N  N items that crash their worker every time (``--sim-fault crash:item=I``),
                best with --max-attempts 3: exactly those become error rows, no core retired

Examples:
    python tools/soak.py                                  # one run with random faults
    python tools/soak.py --mode kill --fifos 12           # kill -9 while a reader blocks
    python tools/soak.py --poison 5 --max-attempts 3
Use ``--workdir DIR`` to keep the dataset between invocations (it takes a while to write).
Timeouts are generous by default (--run-timeout-s 1800): the machine may be shared.
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

from batchinfer.data.whole_file import HANGING_FILE_ENV
from batchinfer.demo import make_npy_dataset, model_path
from batchinfer.engine.slots import SEGMENT_PREFIX, SHM_DIR
from batchinfer.sink.predictions import PART_GLOB, PREDICTIONS_DIR

CORES = 3
FAULT_KINDS = ("crash", "hang", "none")
#: The FIFO the hanging items link to; readers are told to block on it (HANGING_FILE_ENV).
FIFO_NAME = "nobody-writes.fifo"
MODES = ("plain", "interrupt", "kill", "freeze", "ctrl-z", "second-run")
HANG_SUFFIX = "-hang.npy"
# The emulator's E/W line when a fault fires: per core (core=C:call=N) or per item (item=I).
_FIRED_RE = re.compile(r"injected fault ((crash|hang|none):(?:core=(\d+):call=\d+|item=(\d+)))")
# What the soak writes into a run's stderr record when it freezes a worker.
_FROZE = "soak: froze worker pid "
_THAWED = "soak: thawed worker pid "
# The coordinator's warnings when a worker died or was killed (see Engine._on_worker_exit),
# and when a reader was replaced (Engine._on_reader_exit).
_DEATH_RE = re.compile(r"^warning: core (\d+)(?:: (.*); restarting it in | retired)")
_READER_RE = re.compile(r"^warning: reader (\d+) (.*); started a new one\.$")
# How the watchdog words a worker it killed (watchdog.py), and a worker that died itself.
_WATCHDOG_KILL = ("hung for more than", "frozen or stopped")
_CRASHED = "worker process crashed"
# Never on a clean run's stderr: a child's traceback after its parent died, the resource
# tracker's complaint about segments left registered with it.
_NEVER_ON_STDERR = ("Traceback", "BrokenPipeError", "leaked")


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


def hanging_dataset(base: Path, folder: Path, fifo: Path, count: int) -> list[str]:
    """``base`` again in ``folder`` (hard links) plus ``count`` symlinks to ``fifo``.

    The symlinks are named like items (``00123-hang.npy``) and spread evenly over the
    dataset, so readers meet them all through the run. Returns their names.
    """
    names = sorted(n for n in os.listdir(base) if n.endswith(".npy"))
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name in names:
        try:
            os.link(base / name, folder / name)
        except OSError:  # another file system, or no hard links there
            (folder / name).symlink_to(base / name)
    if not fifo.exists():
        os.mkfifo(fifo)
    hanging = [
        Path(names[int((j + 0.5) * len(names) / count)]).stem + HANG_SUFFIX for j in range(count)
    ]
    for name in hanging:
        (folder / name).symlink_to(fifo.resolve())
    return hanging


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

    def fired(self) -> list[tuple[str, int | None, int | None]]:
        """(kind, core, item) of every injected fault that fired, from the sim's E/W lines."""
        out = []
        for line in self.stderr_lines:
            if m := _FIRED_RE.search(line):
                out.append((m[2], None if m[3] is None else int(m[3]), m[4] and int(m[4])))
        return out

    def last_line(self) -> str:
        lines = self.stdout.strip().splitlines()
        return lines[-1] if lines else ""


def _own_process_group() -> dict:
    # A process group of its own in our session: the soak can signal the whole run as a
    # terminal does (SIGINT, SIGTSTP), and the group is not orphaned, so the kernel does
    # not discard SIGTSTP as it would in a new session.
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}  # pragma: no cover - Python 3.10


class RunWatcher:
    """Starts one run in its own process group, drains its output, records its descendants."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.rec = RunRecord(name)
        self.started = threading.Event()
        self.log_path = log_path
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **_own_process_group(),
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

    def running(self) -> bool:
        return self.proc.poll() is None

    def workers(self) -> list[int]:
        """Pids of the run's core workers now: the descendants that map the output segment
        (grandchildren: they are forked by the run's fork server)."""
        out_segment = f"/dev/shm/{SEGMENT_PREFIX}-{self.proc.pid}-"
        pids = []
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                with contextlib.suppress(OSError):
                    maps = Path(f"/proc/{child.pid}/maps").read_text()
                    if any(
                        line.endswith("-out") and out_segment in line for line in maps.splitlines()
                    ):
                        pids.append(child.pid)
        return pids

    def blocked_on_fifo(self) -> list[int]:
        """Pids of descendants blocked in open() of a FIFO that has no writer."""
        # No event says "the reader is blocked in open()": the kernel says where it waits.
        blocked = []
        for pid in list(self.rec.descendants):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/wchan").read_text() == "wait_for_partner":
                    blocked.append(pid)
        return blocked

    def wait(self, timeout: float) -> RunRecord:
        """Wait for the run to end (kill it after ``timeout`` s) and return its record."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            print(f"[{self.rec.name}] still running after {timeout:g} s: SIGKILL to its group")
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.rec.exit_code = self.proc.returncode
        self.rec.wall_s = time.monotonic() - self.t0
        self._done.set()
        for t in self._threads:
            t.join(10)
        return self.rec


def alive(pid: int, created: float) -> bool:
    """The process ``pid`` created at ``created`` still exists (not a reuse, not a zombie)."""
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - created) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def status_of(pid: int) -> str | None:
    try:
        return psutil.Process(pid).status()
    except psutil.Error:
        return None


def alive_descendants(rec: RunRecord) -> list[int]:
    """Pids recorded as the run's descendants that still exist."""
    return [pid for pid, created in rec.descendants.items() if alive(pid, created)]


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


def poll_until(predicate, timeout: float, step: float = 0.05) -> bool:
    """True once ``predicate()`` holds, False after ``timeout`` s (for states with no event)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


# ----------------------------------------------------------------------------- checking
@dataclass
class Restarts:
    """Worker and reader restarts read from a run's stderr, matched to the faults behind them.

    One pass in stderr order. A fault that kills a worker (a per-core crash or hang the
    emulator logged) stays open on its core until a restart warning for that core answers
    it; with k instances a worker whose first instance hangs keeps inferring on the others
    until it is killed, so one restart may answer several faults. A poison item's crash and
    a frozen worker name no core: they are open for any core, and answer a restart whose
    reason fits (a crash; a watchdog kill) when no per-core fault of that core does.
    """

    open_per_core: dict[int, dict[str, int]]
    open_poison: int = 0
    open_freezes: int = 0
    deaths: dict[int, int] = field(default_factory=dict)
    readers: list[str] = field(default_factory=list)  # reasons of reader restarts
    answered_freezes: list[str] = field(default_factory=list)  # the warnings that did
    problems: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, lines: list[str]) -> Restarts:
        r = cls(
            {c: {"crash": 0, "hang": 0} for c in range(CORES)},
            deaths=dict.fromkeys(range(CORES), 0),
        )
        for line in list(lines):
            if (m := _FIRED_RE.search(line)) and m[2] in ("crash", "hang"):
                if m[3] is not None:
                    r.open_per_core[int(m[3])][m[2]] += 1
                elif m[2] == "crash":
                    r.open_poison += 1
            elif line.startswith(_FROZE):
                r.open_freezes += 1
            elif line.startswith(_THAWED):
                r.open_freezes -= 1
            elif m := _DEATH_RE.match(line):
                r._death(int(m[1]), m[2], line)
            elif m := _READER_RE.match(line):
                r.readers.append(m[2])
        return r

    def _death(self, core: int, reason: str | None, line: str) -> None:
        self.deaths[core] += 1
        if reason is None:
            self.problems.append(f"a core was retired: {line}")
            return
        own = self.open_per_core[core]
        if _CRASHED in reason:
            if own["crash"]:
                pass
            elif self.open_poison:
                self.open_poison -= 1
            else:
                self.problems.append(f"a worker crashed without a fault: {line}")
        elif any(k in reason for k in _WATCHDOG_KILL):
            if own["hang"]:
                pass
            elif self.open_freezes:
                self.open_freezes -= 1
                self.answered_freezes.append(line)
            else:
                self.problems.append(f"a worker was killed without a hang or freeze: {line}")
        else:
            self.problems.append(f"a restart for a reason no fault explains: {line}")
        own["crash"] = own["hang"] = 0

    def open_faults(self) -> int:
        """Faults not yet answered by a restart."""
        per_core = sum(sum(v.values()) for v in self.open_per_core.values())
        return per_core + self.open_poison + self.open_freezes


@dataclass
class Soak:
    """The state of one soak invocation: where things are, what was seen, what went wrong."""

    args: argparse.Namespace
    label: str  # the mode and its fault options, e.g. kill-fifos12
    work: Path
    dataset: Path
    out: Path
    tmp: Path
    faults: list[str]
    hanging: set[str]  # ids of the items that are symlinks to a FIFO
    poison: set[int]  # indexes of the items that crash their worker every time
    total: int  # items in the dataset, hanging ones included
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    measured: list[str] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)
    watchers: list[RunWatcher] = field(default_factory=list)
    freezes: int = 0

    def check(self, ok: bool, what: str) -> bool:
        if not ok:
            self.violations.append(what)
            print(f"  VIOLATION: {what}")
        return ok

    def measure(self, what: str) -> None:
        self.measured.append(what)
        print(f"  measured: {what}")

    def argv(self, *extra: str) -> list[str]:
        a = self.args
        argv = [
            sys.executable, "-m", "batchinfer", "run", str(self.dataset),
            "--model", str(model_path("digits")),
            "--backend", "sim",
            "--sim-npu-ms", str(a.npu_ms),
            "--sim-host-ms", str(a.host_ms),
            "-k", str(a.k),
            "--max-attempts", str(a.max_attempts),
            "--inference-timeout-s", str(a.inference_timeout_s),
            "--decode-timeout-s", str(a.decode_timeout_s),
            "--startup-timeout-s", str(a.startup_timeout_s),
            "--drain-timeout-s", str(a.drain_timeout_s),
            "--part-rows", str(a.part_rows),
            "--out", str(self.out),
            "--no-progress",
        ]  # fmt: skip
        if a.readers is not None:
            argv += ["--readers", str(a.readers)]
        for spec in self.faults:
            argv += ["--sim-fault", spec]
        return argv + list(extra)

    def env(self) -> dict[str, str]:
        env = dict(os.environ, TMPDIR=str(self.tmp))
        if self.hanging:  # readers open the FIFO as a plain file and block (HANGING_FILE_ENV)
            env[HANGING_FILE_ENV] = os.path.realpath(self.work / FIFO_NAME)
        return env

    def start(self, name: str, *extra: str) -> RunWatcher:
        print(f"[{name}] starting: batchinfer run ... {' '.join(extra)}".rstrip())
        log = self.work / f"{self.label}.{name}.stderr.log"
        watcher = RunWatcher(name, self.argv(*extra), self.env(), log)
        self.watchers.append(watcher)
        return watcher

    def parts(self) -> list[Path]:
        return sorted((self.out / PREDICTIONS_DIR).glob(PART_GLOB))

    def wait_for_progress(self, watcher: RunWatcher, fraction: float) -> bool:
        """Wait until the run said ``started:`` and has written ``fraction`` of the parts."""
        want = max(2, int(fraction * self.total / self.args.part_rows))
        if not watcher.started.wait(self.args.run_timeout_s):
            return False
        return (
            poll_until(
                lambda: not watcher.running() or len(self.parts()) >= want, self.args.run_timeout_s
            )
            and watcher.running()
        )

    def finish(self, watcher: RunWatcher) -> RunRecord:
        rec = watcher.wait(self.args.run_timeout_s)
        self.runs.append(rec)
        fired = rec.fired()
        kinds = {k: sum(1 for f, c, _ in fired if f == k and c is not None) for k in FAULT_KINDS}
        poison = sum(1 for _, c, _ in fired if c is None)
        print(
            f"[{rec.name}] exit {rec.exit_code} after {rec.wall_s:.1f} s; faults fired: "
            + ", ".join(f"{k} {v}" for k, v in kinds.items())
            + f", poison {poison} (of {len(self.faults)} planned); "
            f"{len(rec.descendants)} child processes seen; {rec.last_line()!r}"
        )
        if rec.exit_code not in (0, 1, 130, -signal.SIGKILL):
            print(f"[{rec.name}] stdout:\n{rec.stdout}")
            print(f"[{rec.name}] stderr (last 20 lines):\n" + "\n".join(rec.stderr_lines[-20:]))
        lines = rec.stderr_lines
        bad = [i for i, line in enumerate(lines) if any(w in line for w in _NEVER_ON_STDERR)]
        if not self.check(
            not bad,
            f"[{rec.name}] {len(bad)} stderr line(s) with a traceback, BrokenPipeError or "
            f"'leaked', first: {lines[bad[0]] if bad else ''!r}",
        ):
            print("\n".join(f"    | {line}" for line in lines[max(0, bad[0] - 3) : bad[0] + 20]))
        return rec

    def check_clean(self, rec: RunRecord, grace_s: float = 10.0) -> None:
        """No descendant left (after ``grace_s``), no segment of this coordinator in /dev/shm."""
        poll_until(lambda: not alive_descendants(rec), grace_s, step=0.1)
        left = alive_descendants(rec)
        if self.check(not left, f"[{rec.name}] processes left behind: {describe(left)}"):
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

    def check_stats(self, rec: RunRecord, drained: bool = False) -> Restarts:
        """Restarts: each answers a fault on its core, each fault is answered (see Restarts).

        Also: no core retired (warnings and manifest), core_stats counts the restart
        warnings, and every reader restart names a hanging file. ``drained``: the run was
        stopped, and a worker that faulted while the coordinator drained is stopped without
        a restart, so faults may be left open.
        """
        r = Restarts.read(rec.stderr_lines)
        for problem in r.problems:
            self.check(False, f"[{rec.name}] {problem}")
        self.check(
            drained or not r.open_faults(),
            f"[{rec.name}] faults not answered by a restart: per core {r.open_per_core}, "
            f"poison crashes {r.open_poison}, freezes {r.open_freezes}",
        )
        for reason in r.readers:
            named = re.search(r" while decoding (.+)$", reason)
            self.check(
                named is not None and named[1] in self.hanging,
                f"[{rec.name}] a reader restart without a hanging file: {reason}",
            )
        stats = pq.read_table(self.out / "core_stats.parquet").to_pylist()
        restarts = {r["core"]: r["restarts"] for r in stats if r["core"] is not None}
        print(
            f"[{rec.name}] restarts per core {restarts}; restart warnings {r.deaths}; "
            f"reader restarts {len(r.readers)}"
        )
        why = ""
        if drained and r.open_faults():
            why = (
                f" (faults still open when the run ended, per core: {r.open_per_core}: a worker "
                "killed or crashed while the run drained counts as a restart in core_stats, "
                "though none follows and no warning says so)"
            )
        self.check(
            restarts == r.deaths,
            f"[{rec.name}] core_stats restarts {restarts} differ from the warnings {r.deaths}"
            + why,
        )
        manifest = json.loads((self.out / "manifest.json").read_text())
        self.check(
            not manifest.get("retired_cores"),
            f"[{rec.name}] manifest lists retired cores {manifest.get('retired_cores')}",
        )
        return r

    def check_rows(self, final: RunRecord, fired: int | None = None) -> None:
        """Exactly once over every part, error rows explained, exit code consistent.

        With ``fired`` (worker faults that fired, when one run wrote every row) also: a fault
        charges at most one attempt (a hang or None the item it fired on; a crash the one
        item inside inference(), none if several instances were: they are retried alone,
        uncharged), a frozen worker 0..k. So attempts charged <= fired + k * freezes,
        hanging files left out (their attempts are reads). With k = 1 every fault charges
        its item, so fired <= attempts charged; with k >= 2 a crash while several instances
        infer charges none of them, and those may include an item that had hung or whose
        None was not sent yet, so no lower bound is kept.
        """
        n = self.total
        cols = ["index", "id", "error", "attempt"]
        tables = [pq.read_table(p, columns=cols) for p in self.parts()]
        if tables:
            index = np.concatenate([t["index"].to_numpy() for t in tables])
            attempts = np.concatenate([t["attempt"].to_numpy() for t in tables])
        else:
            index = attempts = np.array([], dtype=np.int64)
        ids = [i for t in tables for i in t["id"].to_pylist()]
        errors = [e for t in tables for e in t["error"].to_pylist()]
        outside = int(((index < 0) | (index >= n)).sum())
        counts = np.bincount(index[(index >= 0) & (index < n)].astype(np.int64), minlength=n)
        missing, dup = int((counts == 0).sum()), int((counts > 1).sum())
        failed = np.array([e is not None for e in errors], dtype=bool)
        print(
            f"[check] {len(index)} rows in {len(tables)} parts: {missing} missing, {dup} "
            f"duplicated, {outside} out of range; {int(failed.sum())} error rows; "
            f"{int((attempts > 1).sum())} rows needed a retry"
        )
        self.check(missing == 0 and dup == 0 and outside == 0, "exactly-once violated")
        if missing or dup:
            bad = np.nonzero(counts != 1)[0][:10].tolist()
            self.notes.append(f"first indices not exactly once: {bad}")
        hang_rows = np.array([i in self.hanging for i in ids], dtype=bool)
        if fired is not None:
            worker = ~hang_rows
            charged = int((attempts - 1)[worker & ~failed].sum() + attempts[worker & failed].sum())
            least = fired if self.args.k == 1 else 0
            most = fired + self.args.k * self.freezes
            print(f"[check] {charged} attempts charged for {fired} faults fired")
            self.check(
                least <= charged <= most,
                f"{charged} attempts charged for {fired} faults (expected {least}..{most})",
            )
        self.check_errors(index, ids, errors)
        leftovers = list((self.out / PREDICTIONS_DIR).glob(".part-*.tmp"))
        self.check(not leftovers, f"temporary part files left: {leftovers}")
        want = 1 if failed.any() else 0
        self.check(
            final.exit_code == want,
            f"[{final.name}] exit code {final.exit_code}, expected {want} for "
            f"{int(failed.sum())} error rows",
        )
        last = final.last_line()
        self.check(last.startswith("complete:"), f"[{final.name}] last line is {last!r}")

    def check_errors(self, index: np.ndarray, ids: list[str], errors: list[str | None]) -> None:
        """Every hanging file and poison item is an error row, and every error row is one of
        those or an item that met a random fault on each of its attempts."""
        max_attempts = self.args.max_attempts
        by_id = dict(zip(ids, errors, strict=True))
        for name in sorted(self.hanging):
            error = by_id.get(name)
            tries = re.split(r"; (?=cannot read )", error) if error else []
            self.check(
                len(tries) == max_attempts and all("the reader process" in t for t in tries),
                f"hanging file {name}: error {error!r}, expected {max_attempts} reader failures",
            )
        by_index = dict(zip(index.tolist(), errors, strict=True))
        # A failure reads "core C: reason"; a reason may itself contain "; ".
        for i in sorted(self.poison):
            error = by_index.get(i)
            tries = re.split(r"; (?=core \d+: )", error) if error else []
            self.check(
                len(tries) == max_attempts and all("crashed" in t for t in tries),
                f"poison item {i}: error {error!r}, expected {max_attempts} crashes",
            )
        symptoms = ("crashed", "hung", "returned None", "frozen or stopped")
        for i, name, error in zip(index.tolist(), ids, errors, strict=True):
            if error is None or name in self.hanging or i in self.poison:
                continue
            if self.poison:
                self.check(False, f"item {i} failed besides the poison items: {error}")
                continue
            failures = re.split(r"; (?=core \d+: )", error)
            explained = len(failures) >= max_attempts and all(
                any(s in part for s in symptoms) for part in failures
            )
            self.check(explained, f"unexplained error row for item {i}: {error}")


def describe(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            out.append(f"{pid} {' '.join(psutil.Process(pid).cmdline())[:80]}")
        except psutil.Error:
            out.append(str(pid))
    return out


def kill_leftover(pid: int) -> None:
    """SIGKILL a process the run left behind (so the soak itself leaves nothing)."""
    with contextlib.suppress(psutil.Error):
        psutil.Process(pid).kill()


# -------------------------------------------------------------------------------- modes
def full_checks(s: Soak, rec: RunRecord, single_run: bool = True) -> None:
    """The checks of a run that wrote every row."""
    s.check_clean(rec)
    s.check_tmp_empty(rec)
    s.check_stats(rec)
    s.check_rows(rec, fired=len(rec.fired()) if single_run else None)


def resume_and_check(s: Soak) -> None:
    resumed = s.finish(s.start("resume", "--resume"))
    full_checks(s, resumed, single_run=False)


def mode_plain(s: Soak) -> None:
    full_checks(s, s.finish(s.start("run")))


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
    resume_and_check(s)


def mode_kill(s: Soak) -> None:
    w = s.start("run")
    if not s.check(s.wait_for_progress(w, s.args.at), "run ended before it could be killed"):
        s.finish(w)
        return
    if s.hanging:
        # A reader blocked in open() cannot notice anything: only the parent-death signal
        # gets rid of it.
        if s.check(
            poll_until(lambda: bool(w.blocked_on_fifo()) or not w.running(), s.args.run_timeout_s)
            and w.running(),
            "[run] no reader was seen blocked on the FIFO",
        ):
            print(f"[run] reader(s) {w.blocked_on_fifo()} blocked in open() of the FIFO")
    else:
        # Just after a hang fires when one comes soon: a worker stuck inside inference()
        # is the hardest worker to get rid of.
        hangs = sum(1 for k, _, _ in w.rec.fired() if k == "hang")
        if poll_until(
            lambda: sum(1 for k, _, _ in w.rec.fired() if k == "hang") > hangs,
            2 * s.args.inference_timeout_s,
            step=0.01,
        ):
            print("[run] a worker has just hung")
    parts_then = len(s.parts())
    os.kill(w.proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    print(f"[run] SIGKILL to the coordinator (pid {w.proc.pid}) with {parts_then} parts on disk")
    rec = s.finish(w)
    s.check_clean(rec, grace_s=s.args.orphan_grace_s)
    s.measure(f"every child gone {time.monotonic() - t0:.1f} s after the SIGKILL (or sooner)")
    # The emulator's state folder in TMPDIR stays after a SIGKILL; the next run sweeps it.
    print(f"[run] left in the run's TMPDIR for the next run to sweep: {s.tmp_left()}")
    resume_and_check(s)
    s.check(not segments_of({rec.pid}), "segments of the killed coordinator still there")


def freeze_worker(
    s: Soak, w: RunWatcher, rng: np.random.Generator
) -> tuple[int, float, float] | None:
    """SIGSTOP one core worker while no other worker fault is open.

    Returns its pid, its create time and the moment of the SIGSTOP.

    The soak's marker in the run's record may come before lines the worker wrote just
    before it stopped (they are still in the pipe). If, once those have arrived, a crash
    or hang is open, the frozen worker may be the one that faulted, and its restart could
    not be told apart: it gets SIGCONT (well within the timeout) and another try.
    """
    settle_s = min(0.5, s.args.inference_timeout_s / 4)
    for _ in range(20):
        # Freeze when no worker fault is open, so the restart that answers it is ours.
        poll_until(
            lambda: not Restarts.read(w.rec.stderr_lines).open_faults() or not w.running(),
            s.args.run_timeout_s,
        )
        workers: list[int] = []
        poll_until(lambda: not w.running() or bool(workers.extend(w.workers()) or workers), 60)  # noqa: B023
        if not workers:
            return None
        pid = int(rng.choice(workers))
        with contextlib.suppress(psutil.Error):
            created = psutil.Process(pid).create_time()
            w.rec.stderr_lines.append(f"{_FROZE}{pid}")
            os.kill(pid, signal.SIGSTOP)
            stopped_at = time.monotonic()
            time.sleep(settle_s)  # for what it wrote before it stopped to reach us
            r = Restarts.read(w.rec.stderr_lines)
            if alive(pid, created) and r.open_faults() == r.open_freezes:
                return pid, created, stopped_at
            os.kill(pid, signal.SIGCONT)
            w.rec.stderr_lines.append(f"{_THAWED}{pid}")
            print(f"[run] a worker fault came with the freeze of {pid}: thawed it, trying again")
    return None


def mode_freeze(s: Soak) -> None:
    w = s.start("run")
    rng = np.random.default_rng(s.args.seed)
    for n in range(s.args.freezes):
        at = s.args.at + n * (0.9 - s.args.at) / max(1, s.args.freezes)
        if not s.check(s.wait_for_progress(w, at), "run ended before a worker could be frozen"):
            break
        frozen = freeze_worker(s, w, rng)
        if not s.check(frozen is not None, "[run] no core worker could be frozen"):
            break
        pid, created, t0 = frozen
        s.freezes += 1
        print(f"[run] SIGSTOP to core worker pid {pid}")
        gone = poll_until(lambda: not alive(pid, created), s.args.run_timeout_s)  # noqa: B023
        took = time.monotonic() - t0
        if not s.check(gone, f"[run] frozen worker {pid} not killed after {took:.0f} s"):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
            continue
        s.measure(
            f"frozen worker {pid} killed {took:.1f} s after SIGSTOP "
            f"(inference timeout {s.args.inference_timeout_s:g} s)"
        )
        # Its clock runs from its last message, a moment before the SIGSTOP.
        s.check(
            took >= 0.9 * s.args.inference_timeout_s,
            f"[run] frozen worker killed after {took:.1f} s, before the timeout",
        )
    rec = s.finish(w)
    for line in Restarts.read(rec.stderr_lines).answered_freezes:
        print(f"[run] answered a freeze: {line}")
    full_checks(s, rec)


def mode_ctrl_z(s: Soak) -> None:
    w = s.start("run")
    for n in range(s.args.stops):
        at = s.args.at + n * (0.9 - s.args.at) / max(1, s.args.stops)
        if not s.check(s.wait_for_progress(w, at), "run ended before it could be stopped"):
            break
        os.killpg(w.proc.pid, signal.SIGTSTP)  # what Ctrl-Z does to the foreground job
        stopped = poll_until(lambda: status_of(w.proc.pid) == psutil.STATUS_STOPPED, 10)
        s.check(stopped, "[run] SIGTSTP did not stop the coordinator")
        print(f"[run] SIGTSTP to the process group; SIGCONT in {s.args.stop_s:g} s")
        time.sleep(s.args.stop_s)  # the pause itself is what is tested
        os.killpg(w.proc.pid, signal.SIGCONT)
    rec = s.finish(w)
    warned = [line for line in rec.stderr_lines if line.startswith("warning:")]
    s.check(not warned, f"[run] warnings after Ctrl-Z (expected none): {warned[:5]}")
    full_checks(s, rec)


def mode_second_run(s: Soak) -> None:
    w = s.start("run")
    if not s.check(s.wait_for_progress(w, s.args.at), "run ended before a second could start"):
        s.finish(w)
        return
    holder = f"pid {w.proc.pid}"
    for extra in ((), ("--resume",), ("--overwrite",)):
        before = {p.name for p in s.parts()}
        name = "second" + "".join(f" {e}" for e in extra)
        second = s.start(name.replace(" --", "-"), *extra)
        rec = second.wait(s.args.run_timeout_s)
        s.runs.append(rec)
        err = "\n".join(rec.stderr_lines)
        first_line = rec.stderr_lines[0] if rec.stderr_lines else ""
        print(f"[{rec.name}] exit {rec.exit_code} after {rec.wall_s:.1f} s: {first_line[:160]}")
        s.measure(f"{name}: exit {rec.exit_code} after {rec.wall_s:.1f} s")
        s.check(rec.exit_code == 2, f"[{rec.name}] exit code {rec.exit_code}, expected 2")
        s.check(holder in err, f"[{rec.name}] stderr does not name the holder ({holder}): {err}")
        s.check("Traceback" not in err, f"[{rec.name}] a traceback: {err}")
        s.check(
            rec.wall_s <= s.args.second_run_limit_s,
            f"[{rec.name}] took {rec.wall_s:.1f} s, not at once",
        )
        s.check(w.running(), f"[{rec.name}] the first run ended before the second did")
        s.check_clean(rec)
        gone = before - {p.name for p in s.parts()}
        s.check(not gone, f"[{rec.name}] parts of the first run disappeared: {sorted(gone)}")
    full_checks(s, s.finish(w))


MODE_FUNCS = {
    "plain": mode_plain,
    "interrupt": mode_interrupt,
    "kill": mode_kill,
    "freeze": mode_freeze,
    "ctrl-z": mode_ctrl_z,
    "second-run": mode_second_run,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mode", choices=MODES, default="plain")
    p.add_argument("--fifos", type=int, default=0, help="hanging files (symlinks to a FIFO)")
    p.add_argument("--poison", type=int, default=0, help="items that crash every time")
    p.add_argument("--items", type=int, default=20000)
    p.add_argument("--workdir", type=Path, help="keep the dataset here (default: a temp dir)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gap", default="300,700", help="calls between faults on a core: LOW,HIGH")
    p.add_argument("--no-faults", action="store_true", help="no random per-core faults")
    p.add_argument("-k", type=int, default=2, help="instances per core")
    p.add_argument("--readers", type=int, help="reader processes (default: the engine's)")
    p.add_argument("--npu-ms", type=float, default=0.3)
    p.add_argument("--host-ms", type=float, default=0.2)
    p.add_argument("--inference-timeout-s", type=float, default=2.0)
    p.add_argument("--decode-timeout-s", type=float, default=5.0)
    p.add_argument("--startup-timeout-s", type=float, default=120.0)
    p.add_argument("--drain-timeout-s", type=float, default=10.0)
    p.add_argument("--max-attempts", type=int, default=2)
    p.add_argument("--part-rows", type=int, default=500)
    p.add_argument("--at", type=float, default=0.4, help="act when this share is done")
    p.add_argument("--freezes", type=int, default=2, help="workers to freeze (freeze mode)")
    p.add_argument("--stops", type=int, default=2, help="Ctrl-Z pauses (ctrl-z mode)")
    p.add_argument("--stop-s", type=float, help="each pause (default: 3 x inference timeout)")
    p.add_argument("--second-run-limit-s", type=float, default=30.0, help="'at once' (second-run)")
    p.add_argument("--orphan-grace-s", type=float, default=15.0)
    p.add_argument("--run-timeout-s", type=float, default=1800.0)
    args = p.parse_args(argv)
    if args.mode == "ctrl-z" and (args.fifos or args.poison):
        p.error("ctrl-z expects no kill at all: it takes no --fifos or --poison")
    if args.stop_s is None:
        args.stop_s = 3 * args.inference_timeout_s
    return args


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
    hanging: list[str] = []
    if args.fifos:
        base, dataset = dataset, work / f"dataset-{args.items}-fifos{args.fifos}"
        hanging = hanging_dataset(base, dataset, work / FIFO_NAME, args.fifos)
    names = sorted(n for n in os.listdir(dataset) if n.endswith(".npy"))
    rng = np.random.default_rng(args.seed + 1)
    readable = [i for i, n in enumerate(names) if not n.endswith(HANG_SUFFIX)]
    poison = sorted(int(i) for i in rng.choice(readable, args.poison, replace=False))
    random_faults = not args.no_faults and args.mode != "ctrl-z"
    faults = fault_plan(args.items, (low, high), args.seed) if random_faults else []
    faults += [f"crash:item={i}" for i in poison]
    label = args.mode + "".join(
        f"-{k}{v}" for k, v in (("fifos", args.fifos), ("poison", args.poison)) if v
    )
    out, tmp = work / f"out-{label}", work / f"tmp-{label}"
    for d in (out, tmp):
        shutil.rmtree(d, ignore_errors=True)
    tmp.mkdir()
    s = Soak(args, label, work, dataset, out, tmp, faults, set(hanging), set(poison), len(names))
    print(
        f"soak ({label}): {len(names)} items ({len(hanging)} hanging, {len(poison)} poison "
        f"{poison[:10]}), cores 0-{CORES - 1}, k={args.k}, npu {args.npu_ms} ms, host "
        f"{args.host_ms} ms, timeouts: inference {args.inference_timeout_s:g} s, decode "
        f"{args.decode_timeout_s:g} s, run {args.run_timeout_s:g} s; max attempts "
        f"{args.max_attempts}; {len(faults)} faults planned "
        f"({', '.join(faults[:3])}{', ...' if faults else ''})"
    )
    t0 = time.monotonic()
    try:
        MODE_FUNCS[args.mode](s)
    finally:
        for w in s.watchers:  # a run the soak was stopped in the middle of (Ctrl-C)
            if w.running():
                with contextlib.suppress(OSError):
                    os.killpg(w.proc.pid, signal.SIGKILL)
    total = time.monotonic() - t0
    print(f"\nsummary ({label}): {len(s.runs)} run(s) in {total:.1f} s")
    for r in s.runs:
        print(
            f"  {r.name}: exit {r.exit_code}, {r.wall_s:.1f} s, faults fired {len(r.fired())}; "
            f"{r.last_line()}"
        )
    for m in s.measured:
        print(f"  measured: {m}")
    for note in s.notes:
        print(f"  note: {note}")
    if own_work and not s.violations:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"  stderr logs: {work}/{label}.*.stderr.log")
    if s.violations:
        print(f"FAILED: {len(s.violations)} violation(s)")
        for v in s.violations:
            print(f"  - {v}")
        return 1
    print("OK: every check held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
