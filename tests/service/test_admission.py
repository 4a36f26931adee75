"""The bound on requests in flight follows the instance's own latency (``Admission``):
judged by a clock the test moves, no server needed."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from runstate.service.admission import CONTENDED_S, IDLE_S, MIN_LIMIT, WINDOW_S, Admission


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _window(a: Admission, clock: Clock, latency_s: float, n: int = 20) -> None:
    """``n`` patches of ``latency_s`` over one window."""
    for _ in range(n):
        clock.now += WINDOW_S / n
        a.observe(latency_s)
    clock.now += 0.001
    a.observe(latency_s)


def test_without_a_target_the_bound_is_the_maximum_whatever_the_latency() -> None:
    clock = Clock()
    a = Admission(128, CollectorRegistry(), clock=clock)
    for _ in range(10):
        _window(a, clock, 5.0)
    assert (a.limit, a.per_caller) == (128, 96)


def test_latency_above_the_target_shrinks_the_bound_a_fifth_a_window_to_its_floor() -> None:
    clock = Clock()
    a = Admission(128, CollectorRegistry(), target_s=0.1, clock=clock)
    _window(a, clock, 0.3)
    assert a.limit == 102
    _window(a, clock, 0.3)  # the window after a cut is not judged: what it admitted before is ending
    assert a.limit == 102
    _window(a, clock, 0.3)
    assert a.limit == 81
    for _ in range(30):
        _window(a, clock, 0.3)
    assert a.limit == MIN_LIMIT and a.per_caller == 6
    assert [a.enter("x") for _ in range(9)] == [None] * 8 + ["limit"]  # the bound as it is now


def test_a_few_slow_patches_do_not_move_the_bound_but_a_slow_tenth_does() -> None:
    clock = Clock()
    a = Admission(128, CollectorRegistry(), target_s=0.1, clock=clock)
    for _ in range(5):  # 1 patch in 20 slow: the 90th percentile is a fast one
        for i in range(20):
            clock.now += WINDOW_S / 20
            a.observe(0.5 if i % 20 == 0 else 0.04)
    assert a.limit == 128
    for _ in range(3):  # 3 of 10 slow
        for i in range(20):
            clock.now += WINDOW_S / 20
            a.observe(0.5 if i % 10 < 3 else 0.04)
    assert a.limit < 128


def test_the_bound_grows_back_by_one_a_window_below_half_the_target_and_restarts_after_idleness() -> None:
    clock = Clock()
    a = Admission(128, CollectorRegistry(), target_s=0.1, clock=clock)
    for _ in range(30):
        _window(a, clock, 0.3)
    assert a.limit == MIN_LIMIT
    for _ in range(3):  # under the target, not under half of it: held
        _window(a, clock, 0.07)
    assert a.limit == MIN_LIMIT
    for _ in range(10):
        _window(a, clock, 0.01)
    assert a.limit == MIN_LIMIT + 10
    for _ in range(30):
        _window(a, clock, 0.3)
    clock.now += IDLE_S + 1  # the load that shrank it is gone
    a.observe(0.01)
    assert a.limit == 128


def test_a_maximum_below_the_floor_is_the_bound() -> None:
    clock = Clock()
    a = Admission(4, CollectorRegistry(), target_s=0.1, clock=clock)
    for _ in range(5):
        _window(a, clock, 1.0)
    assert (a.limit, a.per_caller) == (4, 3)


def test_a_caller_alone_takes_every_slot_and_its_share_binds_once_another_wants_one() -> None:
    clock = Clock()
    a = Admission(8, CollectorRegistry(), clock=clock)
    assert [a.enter("x") for _ in range(8)] == [None] * 8  # nobody else wants a slot
    assert a.enter("x") == "limit"
    a.leave("x")
    assert a.enter("x") is None  # refused itself, x alone still may take the free slot
    assert a.enter("y") == "limit"  # y is refused: from now on the others' shares bind
    for _ in range(3):
        a.leave("x")
    assert [a.enter("x") for _ in range(2)] == [None, "caller"]  # x is back at its share, 6
    assert a.enter("y") is None
    # while y holds a slot, x's share binds however long ago y was refused
    clock.now += CONTENDED_S + 1
    assert a.enter("x") == "caller"
    a.leave("y")
    assert a.enter("x") is None  # y gone and no refusal for long: x may take the free slots
