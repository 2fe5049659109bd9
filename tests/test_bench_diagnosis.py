"""What limited a run, from synthetic evidence: each bound, with the numbers that show it."""

from __future__ import annotations

from dataclasses import replace

from batchinfer.bench.diagnosis import Evidence, busy_processes, diagnose, with_emulator_share
from batchinfer.errors import render_fields

# A quiet 2-CPU machine; three cores, one instance each, everything moderate.
BASE = Evidence(
    cpus=2,
    instances_per_core=1,
    utilization={0: 0.5, 1: 0.5, 2: 0.5},
    instances_busy={0: 0.5, 1: 0.5, 2: 0.5},
    npu_load={0: 0.5, 1: 0.5, 2: 0.5},
    npu_load_source="emulator time model",
    coordinator_cpu=0.3,
    reader_cpu=[],
    worker_cpu=[0.1, 0.1, 0.1],
    other_cpus=0.05,
    machine_cpus=0.7,
    wait_p50_ms=6.0,
    latency_p50_ms=2.0,
    runnable=1.2,
)


def flags(text: str) -> str:
    return render_fields(text, lambda f: "--" + f.rsplit(".", 1)[-1].replace("_", "-"))


def test_cores_busy_95_percent_is_npu_bound_with_the_load_per_core():
    d = diagnose(
        replace(
            BASE,
            npu_load={0: 0.99, 1: 0.97, 2: 0.98},
            instances_busy={0: 0.99, 1: 0.99, 2: 0.99},
        )
    )
    assert d.bound == "npu" and d.saturated
    assert "busy 98 % of the time (core 0 99 %, core 1 97 %, core 2 98 %" in d.summary
    assert d.numbers["npu_load"] == 0.98


def test_instances_always_in_inference_with_an_idle_npu_are_host_bound_and_k_is_suggested():
    d = diagnose(
        replace(
            BASE,
            npu_load={0: 0.25, 1: 0.25, 2: 0.25},
            instances_busy={0: 0.99, 1: 0.99, 2: 0.99},
            latency_p50_ms=8.0,
        )
    )
    assert d.bound == "host"
    assert "inside inference() 99 % of the time but the NPU only 25 %" in d.summary
    assert "--instances-per-core 4 (k / NPU load = 1/0.25)" in flags(d.advice)


def test_host_bound_suggests_at_least_one_more_instance():
    d = diagnose(replace(BASE, npu_load={0: 0.9}, instances_busy={0: 0.98}, utilization={0: 1}))
    assert d.bound == "host"
    assert "--instances-per-core 2 " in flags(d.advice)


def test_without_an_npu_load_the_diagnosis_says_it_cannot_tell_npu_from_host():
    d = diagnose(
        replace(BASE, npu_load=None, npu_load_source=None, instances_busy={0: 0.99, 1: 0.99})
    )
    assert d.bound == "host"
    assert "NPU load could not be read" in d.summary
    assert "instances sweep" in d.advice


def test_busy_instances_whose_workers_wait_for_cpu_on_a_full_machine_are_cpu_starved():
    d = diagnose(
        replace(
            BASE,
            instances_busy={0: 0.99, 1: 0.99, 2: 0.99},
            worker_cpu=[0.7, 0.7, 0.6],
            machine_cpus=1.98,
            runnable=4.5,
        )
    )
    assert d.bound == "cpu"
    assert "on 2 CPUs, 99 % busy" in d.summary


def test_idle_cores_on_a_machine_with_more_runnable_tasks_than_cpus_are_cpu_starved():
    d = diagnose(replace(BASE, machine_cpus=1.95, runnable=5.8, other_cpus=1.2))
    assert d.bound == "cpu"
    assert "5.8 tasks running or waiting for a CPU" in d.summary
    assert d.numbers["busy_processes"] == 6


def test_a_long_run_queue_is_cpu_starved_though_the_machine_looks_a_little_idle():
    """bench at npu 0.5 ms, -k 2, on the 2-CPU VM: 4.5 tasks runnable on 2 CPUs, 89.5 %
    busy (idle only while every process slept at once). It was said to be limited by
    nothing, with the advice to add readers or slots; the CPUs were what it waited for."""
    bench = replace(
        BASE,
        instances_per_core=2,
        utilization={0: 0.90, 1: 0.89, 2: 0.88},
        instances_busy={0: 0.84, 1: 0.82, 2: 0.81},
        npu_load={0: 0.84, 1: 0.83, 2: 0.83},
        coordinator_cpu=0.37,
        reader_cpu=[0.30],
        worker_cpu=[0.38, 0.38, 0.38],
        other_cpus=0.0,
        machine_cpus=1.79,
        wait_p50_ms=0.3,
        latency_p50_ms=0.98,
        runnable=4.5,
    )
    d = diagnose(bench)
    assert d.bound == "cpu" and d.saturated
    assert "4.5 tasks running or waiting for a CPU" in d.summary
    # A shorter queue on the same machine is not starvation: some processes merely ran.
    assert not diagnose(replace(bench, runnable=3.5)).saturated
    # Nor is a long queue on a machine mostly idle (samples taken in bursts).
    assert not diagnose(replace(bench, machine_cpus=1.4)).saturated


def test_busy_processes_count_ours_at_half_a_cpu_and_others_in_whole_cpus():
    e = replace(BASE, coordinator_cpu=0.6, reader_cpu=[0.9, 0.4], other_cpus=1.4, runnable=None)
    assert busy_processes(e) == 2 + 1
    assert busy_processes(replace(e, runnable=4.6)) == 5


def test_saturated_readers_with_an_empty_ready_queue_are_decode_bound():
    d = diagnose(
        replace(
            BASE,
            reader_cpu=[0.97],
            utilization={0: 0.1, 1: 0.1, 2: 0.1},
            instances_busy={0: 0.1, 1: 0.1, 2: 0.1},
            wait_p50_ms=0.3,
            read_p50_ms=45.0,
            machine_cpus=1.3,
            runnable=1.5,
        )
    )
    assert d.bound == "decode"
    assert "1 reader(s) used 0.97 CPUs (decode p50 45.00 ms per item)" in d.summary
    assert "inputs waited 0.30 ms (p50)" in d.summary
    assert "--readers" in flags(d.advice) and "--cpu-affinity" in flags(d.advice)


def test_saturated_readers_whose_inputs_queue_for_cores_are_not_decode_bound():
    d = diagnose(replace(BASE, reader_cpu=[0.97], wait_p50_ms=6.0, latency_p50_ms=2.0))
    assert not d.saturated and d.summary.startswith("nothing was saturated")


def test_a_saturated_coordinator_is_coordinator_bound():
    d = diagnose(replace(BASE, coordinator_cpu=0.96, machine_cpus=1.4))
    assert d.bound == "coordinator"
    assert "coordinator used 0.96 CPUs" in d.summary


def test_nothing_saturated_names_the_most_loaded_and_says_so():
    d = diagnose(replace(BASE, reader_cpu=[0.7], instances_busy={0: 0.6, 1: 0.6, 2: 0.6}))
    assert not d.saturated
    assert d.bound == "decode"  # readers at 0.70 beat instances at 0.60 and the coordinator
    assert d.summary.startswith("nothing was saturated")
    assert d.to_json()["saturated"] is False


def test_a_cpu_starved_emulated_run_says_how_many_cpus_the_emulators_calls_took():
    starved = diagnose(
        replace(
            BASE,
            utilization={0: 0.8, 1: 0.8, 2: 0.8},
            instances_busy={0: 0.8, 1: 0.8, 2: 0.8},
            worker_cpu=[0.6, 0.6, 0.6],
            machine_cpus=1.9,
            runnable=4.5,
        )
    )
    assert starved.bound == "cpu"
    d = with_emulator_share(starved, call_cpu_ms=0.164, samples_per_s=5300.0)
    assert d.advice.startswith(starved.advice)
    assert "its own calls took about 0.87 of these CPUs (0.164 ms" in d.advice
    assert "× 5,300 calls/s" in d.advice
    assert d.numbers["emulator_call_cpus"] == 0.869
    assert d.summary == starved.summary and d.bound == "cpu"


def test_the_emulators_share_is_said_only_of_a_cpu_starved_emulated_run():
    npu = diagnose(replace(BASE, npu_load={0: 0.99, 1: 0.99, 2: 0.99}))
    assert with_emulator_share(npu, call_cpu_ms=0.164, samples_per_s=1500.0) == npu
    starved = diagnose(replace(BASE, machine_cpus=1.95, runnable=5.0))
    assert starved.bound == "cpu"
    assert with_emulator_share(starved, call_cpu_ms=None, samples_per_s=1500.0) == starved


def test_busy_cores_on_an_idle_npu_say_the_time_goes_outside_the_npu():
    # batchinfer's busy time high while the board's own figure says the NPU is mostly idle:
    # the calls spend their time off the NPU (the runtime's host side).
    d = diagnose(
        replace(
            BASE,
            utilization={0: 0.98, 1: 0.97},
            instances_busy={0: 0.98, 1: 0.97},
            npu_load={0: 0.3, 1: 0.2},
            npu_load_source="/sys/kernel/debug/rknpu/load, 20 samples",
        )
    )
    assert d.bound == "host"
    assert "the NPU only 25 % (/sys/kernel/debug/rknpu/load, 20 samples)" in d.summary
    assert "72 % of the time the cores were busy went outside the NPU" in d.summary
    assert d.numbers["outside_npu"] == 0.725


def test_idle_cores_name_the_boards_npu_load_too():
    d = diagnose(replace(BASE, npu_load={0: 0.1, 1: 0.1, 2: 0.1}, npu_load_source="board"))
    assert "the NPU itself 10 % (board)" in d.summary


def test_an_unreadable_board_figure_is_in_the_numbers():
    why = "NPU load: /sys/kernel/debug/rknpu/load is not readable (Permission denied); ..."
    d = diagnose(replace(BASE, npu_load=None, npu_load_source=None, npu_load_unreadable=why))
    assert d.numbers["npu_load_unreadable"] == why and d.numbers["outside_npu"] is None
