"""``--ray local:N``: simulated nodes on this machine that never outlive the command.

The nodes (``ray.cluster_utils.Cluster``: a GCS, a raylet per node, and the agents and
workers each raylet starts) are started by a small keeper process, not by the driver::

    driver ──stdin pipe──► keeper (its own session) ──► gcs_server, raylets ──► agents, workers

Every one of those processes is in the keeper's session (Ray's workers get process groups
of their own, but keep the session). The keeper waits on its stdin. When the driver asks it
to stop (a ``stop`` line) it stops the nodes gracefully, then kills whatever of its session
is left; when stdin closes without one (the driver died, even by ``kill -9``: the kernel
closes the pipe) it kills its whole session at once. Ray's own clean-up cannot do this:
it binds the GCS and raylets to the process that started them (a parent-death signal),
but the dashboard and runtime-env agents and idle workers are the raylets' children and
outlived a killed driver.

Protocol: ``python -m batchinfer.cluster.local N CORES`` (CORES: ``0,1,2``) prints one JSON
line on stdout, ``{"address": ...}`` once the nodes are up or ``{"error": ...}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

import psutil

from batchinfer.cluster.resources import node_resources
from batchinfer.errors import RunFailedError
from batchinfer.messages import setting

#: CPUs each simulated node of ``local:N`` declares (for read tasks; actors take none).
LOCAL_NODE_CPUS = 2
# Simulated nodes are processes on this machine: a node that is removed is found dead
# within ~1.5 s instead of Ray's default ~15 s (health checks every 3 s, 5 misses).
_LOCAL_SYSTEM_CONFIG = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}
#: How long the keeper may take to stop the nodes gracefully before it kills them.
GRACEFUL_STOP_S = 15.0
#: How long the driver waits for the keeper to end after asking it to stop.
_KEEPER_EXIT_S = GRACEFUL_STOP_S + 10.0
#: Starting N nodes takes ~5 s per node on a loaded 2-CPU machine; this is the bound.
START_TIMEOUT_S = 60.0
_KILL_ROUNDS = 5


class LocalCluster:
    """N simulated nodes on this machine in a keeper process (see the module docstring).

    ``address`` is the GCS address to pass to ``ray.init``. :meth:`stop` ends the nodes
    and every process they started; so does the death of this process.
    """

    def __init__(self, n: int, cores: Sequence[int]) -> None:
        self.n = n
        self.cores = tuple(cores)
        self.address = ""
        self.process: subprocess.Popen | None = None
        # The keeper's stderr (Ray's start-up lines): its last line explains a failed start.
        self._log = tempfile.TemporaryFile(prefix="batchinfer-ray-local-")  # noqa: SIM115

    def start(self, timeout_s: float = START_TIMEOUT_S) -> LocalCluster:
        """Start the keeper and wait for the address; RunFailedError when it fails."""
        import batchinfer

        env = dict(os.environ)
        # The keeper imports batchinfer from where this process did (a checkout, a venv).
        root = str(Path(batchinfer.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        cores = ",".join(str(c) for c in self.cores)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "batchinfer.cluster.local", str(self.n), cores],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            start_new_session=True,  # a session of its own: the keeper sweeps it
        )
        try:
            reply = self._reply(timeout_s)
        except BaseException:
            self.stop(graceful=False)
            raise
        if "address" not in reply:
            self.stop(graceful=False)
            raise RunFailedError(
                "the local Ray cluster (" + setting("ray") + f" local:{self.n}) did not start: "
                f"{reply.get('error', 'no reason given')}"
            )
        self.address = reply["address"]
        return self

    def _reply(self, timeout_s: float) -> dict:
        assert self.process is not None and self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        line = b""
        with selectors.DefaultSelector() as sel:
            sel.register(self.process.stdout, selectors.EVENT_READ)
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return {"error": f"not up within {timeout_s:g} s{self._last_words()}"}
                chunk = os.read(self.process.stdout.fileno(), 4096)
                if not chunk:
                    return {"error": f"its keeper process ended{self._last_words()}"}
                line += chunk
        try:
            return json.loads(line)
        except ValueError:
            return {"error": f"unexpected reply {line[:200]!r}"}

    def _last_words(self) -> str:
        """The keeper's last line on stderr, as ``(last: ...)``, or nothing."""
        self._log.seek(0)
        lines = [ln for ln in self._log.read().decode(errors="replace").splitlines() if ln]
        return f" (last: {lines[-1].strip()[:300]})" if lines else ""

    def stop(self, graceful: bool = True) -> None:
        """Stop the nodes and every process they started; wait until they are gone.

        ``graceful=False`` (the nodes never came up) kills them at once.
        """
        process, self.process = self.process, None
        if process is None:
            return
        if graceful:
            with contextlib.suppress(OSError, ValueError):
                assert process.stdin is not None
                process.stdin.write(b"stop\n")
                process.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=_KEEPER_EXIT_S)
        if process.poll() is None:  # still starting, or stuck: its session goes anyway
            kill_session(process.pid)
            process.wait()
        with contextlib.suppress(OSError, ValueError):
            assert process.stdin is not None
            process.stdin.close()
        with contextlib.suppress(OSError, ValueError):
            assert process.stdout is not None
            process.stdout.close()
        self._log.close()


def session_processes(sid: int) -> list[psutil.Process]:
    """The processes of session ``sid`` (this process left out)."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if os.getsid(proc.pid) == sid:
                found.append(proc)
        except OSError:  # gone meanwhile, or not ours to see
            continue
    return found


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (but this one) and wait until they are gone.

    A few rounds: a raylet may start a worker between a scan and its own death.
    """
    for _ in range(_KILL_ROUNDS):
        procs = session_processes(sid)
        if not procs:
            return
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(procs, timeout=5)


def start_local_cluster(n: int, cores: Sequence[int]) -> Any:
    """N simulated nodes on this machine (ray.cluster_utils.Cluster), each with ``cores``.

    In this process: they live as long as it does, or until :func:`stop_local_cluster`.
    ``--ray local:N`` starts them in a keeper process instead (:class:`LocalCluster`).
    """
    from ray.cluster_utils import Cluster

    common: dict[str, Any] = {
        "num_cpus": LOCAL_NODE_CPUS,
        "resources": node_resources(cores),
        "include_dashboard": False,
    }
    cluster = Cluster(shutdown_at_exit=True)
    try:
        cluster.add_node(node_name="node0", _system_config=_LOCAL_SYSTEM_CONFIG, **common)
        for i in range(1, n):
            cluster.add_node(node_name=f"node{i}", wait=False, **common)
        cluster.wait_for_nodes()
    except BaseException:
        stop_local_cluster(cluster)
        raise
    return cluster


def stop_local_cluster(cluster: Any) -> None:
    """Stop every node of a local cluster, the head last (call ray.shutdown() first).

    ``Cluster.shutdown`` removes the worker nodes only; the head's processes would live
    until this process exits.
    """
    cluster.shutdown()
    if cluster.head_node is not None:
        cluster.remove_node(cluster.head_node)


# ---------------------------------------------------------------------- the keeper
def _keeper(n: int, cores: Sequence[int]) -> int:
    """Start the nodes, say where they are, wait until the driver stops or dies; stop them
    gracefully when asked to (the caller kills what is left either way)."""
    # The reply channel is the real stdout; anything else printed goes to stderr.
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    try:
        cluster = start_local_cluster(n, cores)
    except Exception as e:  # told to the driver, which says it in its error
        text = str(e).strip().splitlines()
        _send(reply, {"error": text[-1] if text else type(e).__name__})
        return 1
    signal.signal(signal.SIGTERM, _exit_on_signal)  # Ray's Node set its own
    _send(reply, {"address": cluster.address})
    told = sys.stdin.buffer.readline()  # b"stop\n", or b"" when the driver is gone
    if told.strip() == b"stop":
        stopper = threading.Thread(target=stop_local_cluster, args=(cluster,), daemon=True)
        stopper.start()
        stopper.join(GRACEFUL_STOP_S)
    return 0


def _send(reply: TextIO, message: dict) -> None:
    with contextlib.suppress(OSError):
        reply.write(json.dumps(message) + "\n")
        reply.flush()


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str]) -> NoReturn:
    """The keeper: ``N CORES`` (see the module docstring); it ends with its whole session."""
    # The command blocks SIGTERM (its signal thread takes it) and children inherit the mask:
    # the keeper takes SIGTERM as "the driver is gone". SIGINT and SIGHUP stay ignored.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    signal.signal(signal.SIGTERM, _exit_on_signal)
    sid, code = os.getsid(0), 1
    try:
        code = _keeper(int(argv[0]), [int(c) for c in argv[1].split(",")])
    finally:
        kill_session(sid)
        sys.stderr.flush()
        os._exit(code)  # not through Ray's exit hooks: nothing is left for them to stop


if __name__ == "__main__":
    main(sys.argv[1:])
