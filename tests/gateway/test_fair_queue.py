"""The fair queue alone: slots, each key's share, the VTC order, deadlines and departures."""

from __future__ import annotations

import asyncio

import pytest

from serving.gateway.errors import ClientGone
from serving.gateway.fair_queue import FairQueue, QueueTimeout, Turn, lowest_class


def run(scenario: object) -> None:
    asyncio.run(scenario)  # type: ignore[arg-type]


async def started(queue: FairQueue, key: str, cost: int = 100, weight: float = 1.0) -> Turn:
    return await asyncio.wait_for(queue.turn(key, cost=cost, weight=weight), 1)


def test_a_free_slot_is_taken_at_once_and_given_back() -> None:
    async def scenario() -> None:
        queue = FairQueue(2, reserved=0, timeout_s=5)
        first = await started(queue, "a")
        second = await started(queue, "a")
        assert (queue.running, queue.waiting()) == (2, 0)
        assert first.waited_s == second.waited_s == 0.0
        queue.release(first)
        queue.release(first)  # twice is once
        assert queue.running == 1
        queue.release(second)
        assert queue.running == 0 and queue.running_of("a") == 0

    run(scenario())


def test_one_key_never_takes_the_reserved_slots() -> None:
    async def scenario() -> None:
        queue = FairQueue(3, reserved=1, timeout_s=5)
        held = [await started(queue, "noisy") for _ in range(2)]
        third = asyncio.create_task(queue.turn("noisy", cost=100))
        await asyncio.sleep(0.01)
        assert not third.done() and queue.waiting("noisy") == 1  # a slot is free, not its
        quiet = await started(queue, "quiet")  # finds the reserved slot at once
        assert quiet.waited_s < 0.01
        queue.release(held[0])
        assert (await asyncio.wait_for(third, 1)).key == "noisy"
        for turn in (held[1], quiet, third.result()):
            queue.release(turn)

    run(scenario())


async def next_started(queue: FairQueue, ended: Turn, tasks: list[asyncio.Task[Turn]]) -> Turn:
    """Release `ended`; the turn that started in its place (taken out of `tasks`)."""
    queue.release(ended)
    await asyncio.wait(tasks, timeout=1, return_when=asyncio.FIRST_COMPLETED)
    await asyncio.sleep(0.01)  # a second one would be done by now too
    started_now = [task for task in tasks if task.done()]
    assert len(started_now) == 1
    tasks.remove(started_now[0])
    return started_now[0].result()


def test_the_key_served_least_goes_next() -> None:
    async def scenario() -> None:
        queue = FairQueue(2, reserved=0, timeout_s=5)
        held = [await started(queue, "noisy") for _ in range(2)]
        tasks = [asyncio.create_task(queue.turn("noisy", cost=100)) for _ in range(3)]
        await asyncio.sleep(0.01)
        tasks.append(asyncio.create_task(queue.turn("quiet", cost=100)))
        await asyncio.sleep(0.01)
        # quiet is lifted to noisy's 200 and runs nothing: it goes first, though it came last
        turn = await next_started(queue, held[0], tasks)
        order = [turn.key]
        for _ in range(3):
            turn = await next_started(queue, turn, tasks)
            order.append(turn.key)
        assert order == ["quiet", "noisy", "noisy", "noisy"]
        queue.release(turn)
        queue.release(held[1])
        assert queue.running == 0

    run(scenario())


def test_weights_share_slots_in_proportion() -> None:
    async def scenario() -> None:
        queue = FairQueue(1, reserved=0, timeout_s=5)
        turn = await started(queue, "heavy", weight=2.0)
        tasks = [
            asyncio.create_task(queue.turn(key, cost=100, weight=weight))
            for _ in range(6)
            for key, weight in (("heavy", 2.0), ("light", 1.0))
        ]
        await asyncio.sleep(0.01)
        served: list[str] = []
        for _ in range(9):
            turn = await next_started(queue, turn, tasks)
            served.append(turn.key)
        assert served.count("heavy") == 2 * served.count("light")
        queue.release(turn)
        for task in tasks:
            task.cancel()

    run(scenario())


def test_an_idle_key_earns_no_credit_and_owes_nothing_for_an_idle_past() -> None:
    async def scenario() -> None:
        queue = FairQueue(4, reserved=0, timeout_s=5)
        for _ in range(3):  # "old" was served while nobody else asked
            queue.release(await started(queue, "old", cost=1000))
        busy = await started(queue, "busy", cost=100)
        assert queue.virtual("busy") == 100
        more = await started(queue, "busy", cost=100)
        back = await started(queue, "old", cost=100)  # lifted to the least active: busy's 200
        assert queue.virtual("old") == 200 + 100
        queue.release(busy)
        queue.release(more)
        late = await started(queue, "late", cost=100)  # old is active at 300
        assert queue.virtual("late") == 300 + 100
        for turn in (back, late):
            queue.release(turn)

    run(scenario())


def test_what_was_charged_corrects_the_counter() -> None:
    async def scenario() -> None:
        queue = FairQueue(1, reserved=0, timeout_s=5)
        turn = await started(queue, "a", cost=500)
        assert queue.virtual("a") == 500
        queue.release(turn, served=120)
        assert queue.virtual("a") == 120

    run(scenario())


def test_a_request_waits_no_longer_than_its_deadline() -> None:
    async def scenario() -> None:
        queue = FairQueue(1, reserved=0, timeout_s=0.05)
        held = await started(queue, "a")
        with pytest.raises(QueueTimeout):
            await queue.turn("b", cost=100)
        assert queue.waiting() == 0 and queue.running == 1
        assert queue.stats["b"].timeouts == 1
        queue.release(held)
        assert queue.running == 0

    run(scenario())


def test_a_client_that_leaves_leaves_the_queue_at_once() -> None:
    async def scenario() -> None:
        queue = FairQueue(1, reserved=0, timeout_s=30)
        held = await started(queue, "a")
        left = asyncio.Event()
        waiting = asyncio.create_task(queue.turn("b", cost=100, gone=left.wait))
        await asyncio.sleep(0.01)
        assert queue.waiting("b") == 1
        left.set()
        with pytest.raises(ClientGone):
            await asyncio.wait_for(waiting, 1)
        assert queue.waiting() == 0 and queue.stats["b"].left == 1
        queue.release(held)
        assert queue.running == 0  # the slot was not handed to the one that left

    run(scenario())


def test_a_cancelled_wait_takes_nothing() -> None:
    async def scenario() -> None:
        queue = FairQueue(1, reserved=0, timeout_s=30)
        held = await started(queue, "a")
        waiting = asyncio.create_task(queue.turn("b", cost=100))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        queue.release(held)
        assert (queue.running, queue.waiting()) == (0, 0)

    run(scenario())


@pytest.mark.parametrize(("slots", "reserved"), [(0, 0), (2, 2), (2, -1)])
def test_bad_sizes_are_refused(slots: int, reserved: int) -> None:
    with pytest.raises(ValueError, match=r"slots|reserved"):
        FairQueue(slots, reserved=reserved, timeout_s=1)


def test_a_request_takes_a_slot_per_sequence() -> None:
    async def scenario() -> None:
        queue = FairQueue(4, reserved=1, timeout_s=5)
        three = await asyncio.wait_for(queue.turn("a", cost=300, seats=3), 1)  # n=3
        assert (queue.running, queue.running_of("a")) == (3, 3)
        two = asyncio.create_task(queue.turn("b", cost=200, seats=2))
        await asyncio.sleep(0.01)
        assert not two.done()  # one slot free, two needed
        one = await started(queue, "c")  # one sequence fits beside the waiting pair
        queue.release(three)
        assert (await asyncio.wait_for(two, 1)).seats == 2
        with pytest.raises(ValueError, match="9 seats"):  # wider than a key's share: never
            await queue.turn("d", cost=900, seats=9)
        queue.release(one)
        queue.release(two.result())
        assert queue.running == 0

    run(scenario())


def test_a_waiter_made_too_wide_by_a_resize_waits_for_all_its_seats() -> None:
    async def scenario() -> None:
        queue = FairQueue(4, reserved=1, timeout_s=5)
        held = [await started(queue, "a"), await started(queue, "a")]
        three = asyncio.create_task(queue.turn("b", cost=300, seats=3))
        await asyncio.sleep(0.01)
        assert not three.done()  # two slots free, three needed
        queue.resize(3)  # an engine drained: a key may hold 2
        for turn in held:
            queue.release(turn)
        await asyncio.sleep(0.01)
        assert not three.done() and queue.running == 0  # never on 2 seats
        queue.resize(4)
        assert (await asyncio.wait_for(three, 1)).seats == 3
        queue.release(three.result())

    run(scenario())


def test_shared_slots_hold_each_key_to_its_share_and_a_new_key_to_the_reserved_ones() -> None:
    """With replicas sharing the engines' slots (`share`): this replica's part, each key's
    share of it, a key without a share yet the reserved slots; `demand` is what it reports."""

    async def scenario() -> None:
        queue = FairQueue(16, reserved=1, timeout_s=5)
        queue.share(4, {"noisy": 2})
        held = [await started(queue, "noisy") for _ in range(2)]
        third = asyncio.create_task(queue.turn("noisy", cost=100))
        await asyncio.sleep(0.01)
        assert not third.done()  # its share here is held
        quiet = await started(queue, "quiet")  # no share yet: the reserved slot
        assert queue.try_turn("other", cost=1) is None  # a request waits: the fair order decides
        assert queue.demand() == {"noisy": (3, 2, 1.0), "quiet": (1, 1, 1.0)}
        queue.share(4, {"noisy": 3, "quiet": 1})  # the next round gives it one more
        assert (await asyncio.wait_for(third, 1)).key == "noisy"
        assert queue.running == 4 and queue.slots == 4 and queue.per_key == 15
        queue.share(16, None)  # Redis away: this replica's own part, its own rules
        assert queue.try_turn("noisy", cost=1) is not None
        for turn in (*held, quiet, third.result()):
            queue.release(turn)

    run(scenario())


def test_resizing_shared_slots_keeps_this_replica_s_part_until_the_next_round() -> None:
    queue = FairQueue(16, reserved=1, timeout_s=5)
    queue.share(5, {})
    queue.resize(32)  # an engine joined
    assert (queue.engine_slots, queue.slots, queue.per_key) == (32, 5, 31)


async def lowest_turn(queue: FairQueue, key: str) -> Turn:
    """A turn asked for in the lowest class (a Batch API line)."""
    with lowest_class():
        return await queue.turn(key, cost=100)


def test_the_lowest_class_runs_when_nothing_else_waits() -> None:
    async def scenario() -> None:
        queue = FairQueue(2, reserved=0, timeout_s=5)
        first = await asyncio.wait_for(lowest_turn(queue, "batch"), 1)
        assert first.waited_s == 0.0 and queue.running_of("batch") == 1
        queue.release(first)

    run(scenario())


def test_a_lowest_class_waiter_yields_to_every_other_waiter() -> None:
    async def scenario() -> None:
        queue = FairQueue(1, reserved=0, timeout_s=5)
        held = await started(queue, "interactive")
        batch = asyncio.create_task(lowest_turn(queue, "batch"))
        await asyncio.sleep(0.01)
        # The batch key has served nothing, so VTC alone would pick it first.
        later = asyncio.create_task(queue.turn("interactive", cost=100))
        await asyncio.sleep(0.01)
        assert queue.waiting() == 2 and queue.waiting("batch") == 1
        queue.release(held)
        interactive = await asyncio.wait_for(later, 1)
        assert not batch.done()
        queue.release(interactive)
        assert (await asyncio.wait_for(batch, 1)).key == "batch"
        queue.release(batch.result())
        assert queue.running == 0 and queue.waiting() == 0

    run(scenario())


def test_the_lowest_class_never_starts_at_once_while_others_wait() -> None:
    async def scenario() -> None:
        queue = FairQueue(2, reserved=1, timeout_s=5)
        held = await started(queue, "a")
        waiting = asyncio.create_task(queue.turn("a", cost=100))  # a's share is held
        await asyncio.sleep(0.01)
        assert queue.waiting("a") == 1
        with lowest_class():
            assert queue.try_turn("batch", cost=100) is None  # a slot is free, yet it waits
        queue.release(held)
        queue.release(await asyncio.wait_for(waiting, 1))

    run(scenario())


def test_a_lowest_class_waiter_times_out_and_leaves_nothing_behind() -> None:
    async def scenario() -> None:
        queue = FairQueue(1, reserved=0, timeout_s=0.05)
        held = await started(queue, "interactive")
        with pytest.raises(QueueTimeout):
            await lowest_turn(queue, "batch")
        assert queue.waiting() == 0 and queue.demand() == {"interactive": (1, 1, 1.0)}
        queue.release(held)

    run(scenario())


def test_the_lowest_class_takes_a_slot_no_waiter_could_take() -> None:
    async def scenario() -> None:
        queue = FairQueue(3, reserved=1, timeout_s=5)
        held = [await started(queue, "a") for _ in range(2)]
        capped = asyncio.create_task(queue.turn("a", cost=100))  # a's share is held
        batch = asyncio.create_task(lowest_turn(queue, "batch"))
        line = await asyncio.wait_for(batch, 1)  # the free slot was a's to take, never
        assert not capped.done() and queue.running_of("batch") == 1
        queue.release(held[0])
        assert (await asyncio.wait_for(capped, 1)).key == "a"
        for turn in (held[1], capped.result(), line):
            queue.release(turn)
        assert queue.running == 0 and queue.waiting() == 0

    run(scenario())


def test_the_lowest_class_leaves_free_slots_to_a_wider_waiter() -> None:
    async def scenario() -> None:
        queue = FairQueue(3, reserved=0, timeout_s=5)
        held = [await started(queue, "a") for _ in range(2)]
        wide = asyncio.create_task(queue.turn("b", cost=100, seats=2))  # 1 slot free of 2
        batch = asyncio.create_task(lowest_turn(queue, "batch"))
        await asyncio.sleep(0.01)
        assert not wide.done() and not batch.done()  # the free slot is kept for b
        queue.release(held[0])
        assert (await asyncio.wait_for(wide, 1)).seats == 2 and not batch.done()
        queue.release(held[1])
        assert (await asyncio.wait_for(batch, 1)).key == "batch"
        for turn in (wide.result(), batch.result()):
            queue.release(turn)

    run(scenario())
