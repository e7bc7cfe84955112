"""tpurun.actions.watchdog: a thread that calls back once when nobody fed it for `timeout` seconds.

Time is a FakeClock patched in as the module's `time`: a test moves it, then waits
until the watchdog's thread has read it again, so nothing depends on how fast this
machine is. The timeouts are tiny only because the thread polls every timeout/4
real seconds.
"""

from __future__ import annotations

import threading

import pytest
from fakes import FakeClock

from tpurun.actions import watchdog
from tpurun.errors import EXIT_HUNG

TIMEOUT = 0.04  # fake seconds; the thread polls every 0.01 real seconds


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    clock = FakeClock(reads_by="tpurun-watchdog")
    monkeypatch.setattr(watchdog, "time", clock.as_time_module())
    return clock


class Calls:
    """The watchdog's callback: records the idle seconds it was called with."""

    def __init__(self) -> None:
        self.idle: list[float] = []
        self.called = threading.Event()

    def __call__(self, idle_seconds: float) -> None:
        self.idle.append(idle_seconds)
        self.called.set()


def watchdog_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tpurun-watchdog"]


@pytest.fixture
def calls():
    calls = Calls()
    yield calls
    assert not watchdog_threads(), "a watchdog thread outlived its test"


def test_fires_once_when_not_fed_and_its_thread_ends(clock, calls):
    dog = watchdog.Watchdog(TIMEOUT, calls)
    dog.start()
    assert clock.wait_for_reads(2)
    assert calls.idle == []
    clock.advance(5 * TIMEOUT)
    assert calls.called.wait(60)
    clock.advance(100 * TIMEOUT)  # long past another timeout: it does not fire again
    dog.stop()
    assert calls.idle == [pytest.approx(5 * TIMEOUT)]


def test_stays_quiet_while_fed(clock, calls):
    dog = watchdog.Watchdog(TIMEOUT, calls)
    dog.start()
    for _ in range(20):  # 10 timeouts in all, never one without a feed
        clock.advance(TIMEOUT / 2)
        dog.feed()
        assert clock.wait_for_reads(2)
    dog.stop()
    assert calls.idle == []


def test_a_pause_stops_the_count_until_resume_which_feeds_it(clock, calls):
    dog = watchdog.Watchdog(TIMEOUT, calls)
    dog.start()
    dog.pause()
    clock.advance(100 * TIMEOUT)
    assert clock.wait_for_reads(2)
    assert calls.idle == []
    dog.resume()  # counts again, from now
    clock.advance(TIMEOUT / 2)
    assert clock.wait_for_reads(2)
    assert calls.idle == []
    clock.advance(TIMEOUT)
    assert calls.called.wait(60)
    dog.stop()
    assert calls.idle == [pytest.approx(1.5 * TIMEOUT)]


def test_stop_ends_the_thread_and_nothing_fires_after_it(clock, calls):
    dog = watchdog.Watchdog(TIMEOUT, calls)
    dog.start()
    assert clock.wait_for_reads(1)
    dog.stop()
    assert not watchdog_threads()
    clock.advance(100 * TIMEOUT)
    assert calls.idle == []


def test_stop_before_start_is_harmless(calls):
    watchdog.Watchdog(TIMEOUT, calls).stop()
    assert calls.idle == []


def test_the_thread_is_a_daemon(clock, calls):
    """A watchdog must never be what keeps a finished process alive."""
    dog = watchdog.Watchdog(TIMEOUT, calls)
    dog.start()
    (thread,) = watchdog_threads()
    assert thread.daemon
    dog.stop()


@pytest.mark.parametrize("timeout", [0, -1.5])
def test_timeout_must_be_positive(timeout):
    with pytest.raises(ValueError, match="must be > 0"):
        watchdog.Watchdog(timeout, lambda idle: None)


class Exited(Exception):
    pass


@pytest.mark.parametrize("tracebacks", [False, True], ids=["message_only", "with_tracebacks"])
def test_exit_hung_prints_the_message_and_exits_with_exit_hung(monkeypatch, capfd, tracebacks):
    codes: list[int] = []

    def fake_exit(code: int) -> None:
        codes.append(code)
        raise Exited

    monkeypatch.setattr(watchdog.os, "_exit", fake_exit)
    with pytest.raises(Exited):
        watchdog.exit_hung("tpurun train: error: no progress", tracebacks=tracebacks)
    assert codes == [EXIT_HUNG] == [3]
    err = capfd.readouterr().err
    assert err.endswith("tpurun train: error: no progress\n")
    # --verbosity=1: where every thread was, the main one (this test) among them.
    assert ("test_exit_hung_prints_the_message" in err) is tracebacks
