"""The scheduler's yield while a request waits on reads (``kvtier.contrib.vllm.yielding``).

An idle loop (steps whose thread ran next to no CPU between them) waits a little
for the reads, so the chain's reads get the GIL and the cores; a loop that
computes only yields.
"""

from __future__ import annotations

import threading
import time

from kvtier.contrib.vllm.yielding import IDLE_CPU, IDLE_SLEEP, IDLE_WALL, StepYield


class _Clocks:
    """A wall clock and a thread CPU clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0
        self.cpu_now = 5.0
        self.slept: list[float] = []

    def wall(self) -> float:
        return self.now

    def cpu(self) -> float:
        return self.cpu_now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def step(self, wall: float, cpu: float) -> None:
        self.now += wall
        self.cpu_now += cpu


def _yield(clocks: _Clocks) -> StepYield:
    return StepYield(clocks.wall, clocks.cpu, clocks.sleep)


def test_an_idle_loop_waits_and_a_computing_loop_only_yields() -> None:
    clocks = _Clocks()
    step = _yield(clocks)
    step()  # the first step knows no last one: a yield
    for _ in range(3):  # vLLM computed nothing: a little Python between the steps
        clocks.step(IDLE_CPU / 4, IDLE_CPU / 4)
        step()
    for _ in range(3):  # a model step: 5 ms of this thread's CPU
        clocks.step(0.005, 0.005)
        step()
    assert clocks.slept == [0, IDLE_SLEEP, IDLE_SLEEP, IDLE_SLEEP, 0, 0, 0]


def test_an_idle_step_slowed_by_the_gil_is_still_idle() -> None:
    # while the reads run, an idle step waits for the GIL: wall time grows, CPU does not
    clocks = _Clocks()
    step = _yield(clocks)
    step()
    for _ in range(3):
        clocks.step(IDLE_WALL * 0.8, IDLE_CPU / 4)
        step()
    assert clocks.slept == [0, IDLE_SLEEP, IDLE_SLEEP, IDLE_SLEEP]


def test_a_long_step_that_ran_little_cpu_is_not_idle() -> None:
    # a step that waited on a device or a worker process, not on the GIL
    clocks = _Clocks()
    step = _yield(clocks)
    step()
    clocks.step(IDLE_WALL * 2, IDLE_CPU / 4)
    step()
    assert clocks.slept == [0, 0]


def test_the_gap_is_measured_from_the_end_of_the_last_steps_wait() -> None:
    # an idle step's own wait is no compute: the step after it is idle too
    clocks = _Clocks()
    step = _yield(clocks)
    step()
    for _ in range(4):
        clocks.step(IDLE_WALL / 2, IDLE_CPU / 2)
        step()
    assert clocks.slept == [0, IDLE_SLEEP, IDLE_SLEEP, IDLE_SLEEP, IDLE_SLEEP]


def test_an_idle_step_waits_on_the_reads_and_ends_once_they_landed() -> None:
    clocks = _Clocks()
    step = _yield(clocks)
    step()
    clocks.step(IDLE_CPU / 4, IDLE_CPU / 4)
    landed = threading.Event()
    landed.set()  # the reads landed already: the wait returns at once
    asked: list[float] = []

    def wait(timeout: float) -> bool:
        asked.append(timeout)
        return landed.wait(timeout)

    step(wait)
    assert asked == [IDLE_SLEEP] and clocks.slept == [0]  # waited, not slept


def test_the_real_thread_clock_tells_an_idle_step_from_a_computing_one() -> None:
    # the default CPU clock, time.thread_time (the wall clock stands still: a busy
    # machine's preemption is no part of what this checks)
    waits: list[float] = []
    step = StepYield(clock=lambda: 0.0)
    step()
    step(waits.append)  # nothing ran between: idle
    deadline = time.thread_time() + 3 * IDLE_CPU
    while time.thread_time() < deadline:  # this thread computes 3 ms
        pass
    step(waits.append)
    assert waits == [IDLE_SLEEP]
