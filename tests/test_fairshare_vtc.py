"""The batch lane's fair share: tokens, not arrival order, decide whose item goes next."""

from __future__ import annotations

import collections

import pytest

from laneway.routing.fairshare import FairShareQueue


def drain(queue: FairShareQueue[str]) -> list[str]:
    return [queue.pop() for _ in range(len(queue))]


def test_a_small_tenant_is_not_starved_by_a_large_backlog() -> None:
    queue: FairShareQueue[str] = FairShareQueue()
    for index in range(500):
        queue.push("bulk", f"bulk-{index}", cost=1000)
    for index in range(5):
        queue.push("small", f"small-{index}", cost=1000)
    order = drain(queue)
    # Equal costs and weights alternate: all five small items leave within the first ten.
    small_positions = [order.index(f"small-{i}") for i in range(5)]
    assert max(small_positions) < 10
    assert order[-1] == "bulk-499"


def test_tokens_not_requests_are_shared() -> None:
    queue: FairShareQueue[str] = FairShareQueue()
    for index in range(40):
        queue.push("long", f"long-{index}", cost=8000)
        queue.push("short", f"short-{index}", cost=1000)
    first = [queue.pop() for _ in range(18)]
    served = collections.Counter(item.split("-")[0] for item in first)
    # 8000-token items are charged 8x as much, so short items go about 8 times as often.
    assert served["short"] == 16
    assert served["long"] == 2


@pytest.mark.parametrize(
    ("weights", "expected_ratio"),
    [
        ({"gold": 3.0, "free": 1.0}, 3),  # gold gets three items per free item
        ({"gold": 1.0, "free": 1.0}, 1),  # equal weights alternate
    ],
)
def test_weights_scale_the_share(weights: dict[str, float], expected_ratio: int) -> None:
    queue: FairShareQueue[str] = FairShareQueue(weights)
    for index in range(100):
        queue.push("gold", f"gold-{index}", cost=100)
        queue.push("free", f"free-{index}", cost=100)
    first = [queue.pop() for _ in range(4 * (expected_ratio + 1))]
    served = collections.Counter(item.split("-")[0] for item in first)
    assert served["gold"] == expected_ratio * served["free"]


def test_an_idle_tenant_cannot_bank_credit() -> None:
    queue: FairShareQueue[str] = FairShareQueue()
    for index in range(10):
        queue.push("steady", f"steady-{index}", cost=100)
    drain(queue)  # steady's counter is now 1000; late's is 0
    for index in range(10):
        queue.push("steady", f"steady-again-{index}", cost=100)
    for index in range(10):
        queue.push("late", f"late-{index}", cost=100)
    # Without the lift, late would take its first ten turns in a row.
    assert queue.counters["late"] == queue.counters["steady"]
    first_four = [queue.pop() for _ in range(4)]
    assert sorted(item.split("-")[0] for item in first_four) == ["late", "late", "steady", "steady"]


def test_fifo_within_a_tenant_and_ties_by_arrival() -> None:
    queue: FairShareQueue[str] = FairShareQueue()
    queue.push("b", "b-0", cost=10)
    queue.push("a", "a-0", cost=10)
    queue.push("a", "a-1", cost=10)
    assert queue.peek_tenant() == "b"  # equal counters: b's head arrived first
    assert drain(queue) == ["b-0", "a-0", "a-1"]


def test_completion_tokens_charged_later_count_too() -> None:
    queue: FairShareQueue[str] = FairShareQueue()
    queue.push("a", "a-0", cost=10)
    queue.push("b", "b-0", cost=10)
    assert queue.pop() == "a-0"
    queue.charge("a", 500)  # a's item produced a long completion
    queue.push("a", "a-1", cost=10)
    queue.push("b", "b-1", cost=10)
    assert drain(queue) == ["b-0", "b-1", "a-1"]


def test_remove_drops_a_waiting_item_and_pop_on_empty_raises() -> None:
    queue: FairShareQueue[str] = FairShareQueue()
    item = "a-0"
    queue.push("a", item, cost=1)
    assert queue.remove(item)
    assert not queue.remove(item)
    assert len(queue) == 0
    assert queue.backlogged() == ()
    with pytest.raises(IndexError):
        queue.pop()
