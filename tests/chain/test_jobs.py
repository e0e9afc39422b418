"""kvtier.chain.jobs: a call started now, its result reported once when polled."""

from __future__ import annotations

import threading

import pytest

from kvtier.chain.jobs import JobResult, Jobs
from kvtier.spec import ClosedError


@pytest.fixture
def jobs() -> Jobs:
    pool = Jobs(2)
    yield pool
    pool.stop()
    pool.shutdown()


def test_a_job_is_reported_once_with_its_result(jobs: Jobs) -> None:
    first = jobs.submit("get", lambda keys: [k.upper() for k in keys], [b"a", b"b"])
    second = jobs.submit("lookup", lambda: iter([0, None]))
    assert second == first + 1
    assert jobs.wait([first, second], timeout=30)
    done = sorted(jobs.poll(), key=lambda r: r.job_id)
    assert done == [
        JobResult(first, "get", [b"A", b"B"]),
        JobResult(second, "lookup", [0, None]),  # an iterable answer becomes a list
    ]
    assert jobs.poll() == []  # reported once


def test_a_failing_call_is_reported_with_its_error(jobs: Jobs) -> None:
    boom = RuntimeError("chain broke")

    def fail() -> list[bool]:
        raise boom

    job = jobs.submit("put", fail)
    assert jobs.wait([job], timeout=30)
    (result,) = jobs.poll()
    assert (result.job_id, result.kind, result.result, result.error) == (job, "put", [], boom)


def test_wait_names_jobs_and_times_out_while_one_runs(jobs: Jobs) -> None:
    release = threading.Event()
    blocked = jobs.submit("get", lambda: [release.wait(30)])
    quick = jobs.submit("get", lambda: [True])
    assert jobs.wait([quick], timeout=30)  # waits for the named job alone
    assert not jobs.wait([blocked], timeout=0.05)
    assert not jobs.wait(None, timeout=0.05)  # every running job
    release.set()
    assert jobs.wait(None, timeout=30)
    assert {r.job_id: r.result for r in jobs.poll()} == {blocked: [True], quick: [True]}
    assert jobs.wait([blocked, 12345], timeout=0)  # finished and unknown ids: nothing to wait


def test_stop_takes_no_new_jobs_and_shutdown_lets_running_ones_finish() -> None:
    jobs = Jobs(1)
    started, release = threading.Event(), threading.Event()

    def slow() -> list[int]:
        started.set()
        release.wait(30)
        return [1]

    job = jobs.submit("put", slow)
    assert started.wait(30)
    assert jobs.stop() is True
    assert jobs.stop() is False  # the caller closes the chain the first time only
    with pytest.raises(ClosedError):
        jobs.submit("put", lambda: [2])
    threading.Timer(0.05, release.set).start()
    jobs.shutdown()
    assert jobs.poll() == [JobResult(job, "put", [1])]
