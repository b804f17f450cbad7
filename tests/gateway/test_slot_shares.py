"""How replicas on one Redis share the engines' slots (serving/gateway/slot_shares.py)."""

from __future__ import annotations

import itertools

from serving.gateway.slot_shares import Shares, share_slots


def total_of(shares: Shares, replicas: list[str]) -> int:
    return sum(shares.replica(replica) for replica in replicas)


def test_one_replica_alone_gives_a_flooding_key_all_but_the_reserved_slots() -> None:
    shares = share_slots(16, reserved=1, demand={"r1": {"noisy": 64}}, weights={})
    assert shares.key("r1", "noisy") == 15 and shares.replica("r1") == 16


def test_a_flood_through_one_replica_leaves_a_quiet_key_its_seats_on_another() -> None:
    demand = {"r1": {"noisy": 64}, "r2": {"quiet": 2}}
    shares = share_slots(16, reserved=1, demand=demand, weights={})
    assert shares.key("r2", "quiet") == 2
    assert shares.key("r1", "noisy") == 16 - 2 - 2  # every replica keeps one reserved
    assert total_of(shares, ["r1", "r2"]) == 16


def test_a_key_small_enough_runs_in_a_reserved_slot_and_moves_no_share() -> None:
    """As one gateway's quiet key takes its reserved slot: a request of a key with no more
    seats than the reserved ones, on either replica, leaves the flood's shares as they were
    (no replica is then left running above a share that shrank under it)."""
    flood = {"r1": {"noisy": 32}, "r2": {"noisy": 32}}
    alone = share_slots(16, reserved=1, demand=flood, weights={})
    # Its requests on either replica, or on both at once (one a report behind the other).
    for on in (["r1"], ["r2"], ["r1", "r2"]):
        demand = {name: {**keys} for name, keys in flood.items()}
        for replica in on:
            demand[replica]["quiet"] = 1
        shares = share_slots(16, reserved=1, demand=demand, weights={})
        assert shares == alone, on  # quiet has no pool share: the reserved slot is its
        assert all("quiet" not in shares.keys[replica] for replica in on)
        assert total_of(shares, ["r1", "r2"]) == 16


def test_a_floods_stray_request_on_a_replica_does_not_take_its_reserved_slot() -> None:
    demand = {"r1": {"noisy": 30}, "r2": {"noisy": 1}}
    shares = share_slots(16, reserved=1, demand=demand, weights={})
    assert "noisy" in shares.keys["r2"]  # a share there (from the pool), not the reserved slot
    assert shares.key("r1", "noisy") + shares.key("r2", "noisy") == 14


def test_while_the_engines_have_room_a_small_key_leaves_the_reserved_slot_free() -> None:
    """The pool nobody wants is lent for what a small key runs in the reserved slots, so a
    key new to that replica starts at once; under a flood nothing is left to lend."""
    quiet = share_slots(16, reserved=1, demand={"r1": {"quiet": 1}, "r2": {}}, weights={})
    assert quiet.replica("r1") == 2 and quiet.replica("r2") == 1
    flooded = {"r1": {"quiet": 1, "noisy": 64}, "r2": {}}
    assert share_slots(16, reserved=1, demand=flooded, weights={}).replica("r1") == 15


def test_small_keys_take_the_reserved_slots_smallest_first_and_the_rest_share_the_pool() -> None:
    demand = {"r1": {"noisy": 64, "b": 1, "a": 1}}
    shares = share_slots(16, reserved=1, demand=demand, weights={})
    assert "a" not in shares.keys["r1"]  # in the reserved slot (by name, a tie on size)
    assert shares.key("r1", "b") == 1 and shares.key("r1", "noisy") == 14
    assert total_of(shares, ["r1"]) == 16


def test_an_idle_replica_keeps_only_its_reserved_slot() -> None:
    shares = share_slots(16, reserved=1, demand={"r1": {"noisy": 64}, "r2": {}}, weights={})
    assert shares.replica("r2") == 1 and shares.key("r1", "noisy") == 14


def test_a_key_through_two_replicas_gets_one_key_s_share_split_between_them() -> None:
    """x floods both replicas, y one: each gets half the pool, x's half split by demand."""
    demand = {"r1": {"x": 64, "y": 64}, "r2": {"x": 64}}
    shares = share_slots(16, reserved=1, demand=demand, weights={})
    x = shares.key("r1", "x") + shares.key("r2", "x")
    assert x == shares.key("r1", "y") == 7
    assert {shares.key("r1", "x"), shares.key("r2", "x")} == {3, 4}
    assert total_of(shares, ["r1", "r2"]) == 16


def test_a_key_that_wants_less_than_its_part_leaves_the_rest_to_the_others() -> None:
    demand = {"r1": {"a": 2, "b": 64}, "r2": {"c": 64}}
    shares = share_slots(32, reserved=1, demand=demand, weights={})
    assert shares.key("r1", "a") == 2
    assert shares.key("r1", "b") == shares.key("r2", "c") == 14


def test_weights_divide_the_pool() -> None:
    shares = share_slots(17, reserved=1, demand={"r1": {"x": 64, "y": 64}}, weights={"x": 3.0})
    assert (shares.key("r1", "x"), shares.key("r1", "y")) == (12, 4)


def test_no_key_gets_more_than_the_slots_less_the_reserved_ones() -> None:
    shares = share_slots(16, reserved=4, demand={"r1": {"x": 64}}, weights={})
    assert shares.key("r1", "x") == 12


def test_more_replicas_than_slots_reserve_none_and_never_overfill() -> None:
    demand: dict[str, dict[str, int]] = {f"r{n}": {} for n in range(5)}
    demand["r0"] = {"x": 9}
    shares = share_slots(4, reserved=1, demand=demand, weights={})
    assert shares.reserved == 0
    assert shares.key("r0", "x") == 3  # still no more than the slots less the reserved one


def test_the_shares_never_sum_past_the_slots_and_every_replica_computes_the_same() -> None:
    keys = ["a", "b", "c"]
    for seats in itertools.product([0, 1, 3, 40], repeat=4):
        demand = {
            "r1": {"a": seats[0], "b": seats[1]},
            "r2": {"b": seats[2], "c": seats[3]},
            "r3": {},
        }
        shares = share_slots(16, reserved=1, demand=demand, weights={})
        assert total_of(shares, ["r1", "r2", "r3"]) <= 16, demand
        for key in keys:
            wanted = sum(replica.get(key, 0) for replica in demand.values())
            got = sum(shares.key(replica, key) for replica in demand)
            assert got <= min(wanted, 15), (demand, key)
        assert share_slots(16, reserved=1, demand=dict(reversed(demand.items())), weights={}) == (
            shares
        )


def test_a_replica_keeps_the_seats_it_runs_when_demand_moves_a_little() -> None:
    """Two small keys' requests on r2, one in its reserved slot, the other taking a seat from
    the flood's pool: the flood's part on r2 (3 running) stays, so r2 never runs more of it
    than its share and its reserved slot stays free for the next key new to it."""
    running = {"r1": {"noisy": 10}, "r2": {"noisy": 3}}
    for others in ({}, {"a": 1, "b": 1}):
        for flood_on_r2 in (7, 8):
            demand = {"r1": {"noisy": 32}, "r2": {"noisy": flood_on_r2, **others}}
            shares = share_slots(16, reserved=1, demand=demand, weights={}, running=running)
            assert shares.key("r2", "noisy") == 3, (others, flood_on_r2, shares)
            assert shares.key("r1", "noisy") + 3 == 14 - shares.key("r2", "b")
            assert shares.key("r2", "b") == (1 if others else 0)
