"""The scheduler's yield while a request waits on reads (``kvtier.contrib.vllm.yielding``).

An idle loop (steps with nothing computed between them) sleeps a little so the
chain's reads get the GIL and the cores; a loop that computes only yields.
"""

from __future__ import annotations

from kvtier.contrib.vllm.yielding import IDLE_GAP, IDLE_SLEEP, StepYield


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_an_idle_loop_sleeps_and_a_computing_loop_only_yields() -> None:
    clock = _Clock()
    step = StepYield(clock, clock.sleep)
    step()  # the first step knows no last one: a yield
    for _ in range(3):  # vLLM computed nothing: the next step comes at once
        clock.now += IDLE_GAP / 10
        step()
    for _ in range(3):  # a model step of 5 ms between the steps' ends
        clock.now += 0.005
        step()
    assert clock.slept == [0, IDLE_SLEEP, IDLE_SLEEP, IDLE_SLEEP, 0, 0, 0]


def test_the_gap_is_measured_from_the_end_of_the_last_steps_sleep() -> None:
    # an idle step's own sleep is no compute: the step after it is idle too
    clock = _Clock()
    step = StepYield(clock, clock.sleep)
    step()
    clock.now += IDLE_GAP / 2
    step()
    clock.now += IDLE_GAP / 2
    step()
    assert clock.slept == [0, IDLE_SLEEP, IDLE_SLEEP]
