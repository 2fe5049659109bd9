"""The end of a run: every child is stopped without waiting out the join timeout (issue 40,
item 11: short runs stalled 5 s at shutdown, "waiting up to 5 s for core N ... then it is
killed"). Each test says which way a child ended (asked, or killed when the wait ran out),
never how long it took."""

from __future__ import annotations

import time

import pytest
from runs import config, exit_code, fast_sim

from batchinfer import run
from batchinfer.engine.plumbing.children import ChildPool, Message
from batchinfer.engine.protocol import Stop, decode
from batchinfer.engine.states import ChildState

# Larger than a pipe holds (64 KiB): a core worker's WorkerReady carries its canary's
# outputs, 2.8 MB for the demo detector's (1, 84, 8400) float32 head.
_BIG = 1 << 20


def _big_report_then_stop(spec, tasks, results) -> None:
    results.send(("up",))
    results.send(("report", b"x" * _BIG))  # blocks until the coordinator reads it
    while not isinstance(decode(tasks.recv()), Stop):
        pass


def test_a_child_sending_more_than_a_pipe_holds_at_the_end_still_hears_stop():
    pool = ChildPool(time.monotonic)
    child = pool.start("worker", 0, _big_report_then_stop, None, 30.0, "starting")
    try:
        # Forked and running (a loaded machine's fork server may take seconds to import):
        # what is left is only the big send, which nobody reads but close().
        assert _first_message(pool) == ("up",)
        child.state = ChildState.READY  # it was ready: asked to stop, and waited for
    finally:
        pool.close(hard=False, join_timeout_s=10.0)
    # Before: nobody read the result pipe while waiting, the child never got past its send,
    # and it was SIGKILLed when the 3 s ran out.
    assert child.proc.exitcode == 0
    assert child.killed_for is None
    assert pool.late_at_close == []


def _first_message(pool: ChildPool) -> object:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for event in pool.poll(0.1):
            if isinstance(event, Message):
                return event.body
    raise AssertionError("the child said nothing")


def _never_reads(spec, tasks, results) -> None:
    time.sleep(60)  # a runtime being created, a canary running: not reading its tasks


def test_a_child_still_starting_at_the_end_is_killed_at_once_not_waited_for():
    pool = ChildPool(time.monotonic)
    child = pool.start("worker", 0, _never_reads, None, 30.0, "creating its runtime")
    pool.close(hard=False, join_timeout_s=3.0)
    assert child.killed_for == "still starting at the end of the run"
    assert pool.late_at_close == []  # not asked to stop and then waited for


@pytest.mark.slow  # 3 s: a run on two cores
def test_a_run_whose_items_are_done_while_a_core_starts_does_not_wait_for_that_core(
    demo_kit, tmp_path, monkeypatch, caplog
):
    # Core 1's canary hangs, so core 1 is still starting when core 0 has done the one item.
    ended: dict[str, str | None] = {}  # each worker: why it was killed (None: it stopped)
    real_close = ChildPool.close

    def close(self, hard, join_timeout_s):
        real_close(self, hard, join_timeout_s)
        ended.update((c.name, c.killed_for) for c in self.children if c.kind == "worker")

    monkeypatch.setattr(ChildPool, "close", close)
    result = run(
        config(
            dataset=demo_kit.dataset,
            model=demo_kit.models["digits"],
            backend="sim",
            sim=fast_sim("hang:core=1:call=1"),
            cores=(0, 1),
            limit=1,
            out=tmp_path / "o",
        )
    )
    assert (result.status, exit_code(result)) == ("complete", 0)
    # Before: core 1 was asked to stop, waited for 5 s ("waiting up to ..."), then killed.
    assert ended == {"core 0": None, "core 1": "still starting at the end of the run"}
    assert "waiting up to" not in caplog.text
