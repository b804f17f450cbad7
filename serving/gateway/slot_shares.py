"""How the engines' slots are shared between gateway replicas on one Redis (docs/fair-sharing.md,
across gateway replicas).

    shares = share_slots(32, reserved=1, demand={"r1": {"a": 40}, "r2": {"b": 1}}, weights={})
    shares.replica("r1")          # slots replica r1 may fill: its keys' shares + reserved
    shares.key("r1", "a")         # of which key a's

Rules:
- every replica keeps `reserved` slots beyond its keys' shares, so a key new to it starts at
  once (as one gateway's queue reserves slots no key may take);
- the rest goes to keys by weighted max-min over their demand summed over the replicas
  (water-filling), no key above `total - reserved`, as one gateway caps a key;
- a key's share is split among the replicas by their demand for it, the remainders by largest
  fraction then replica name: every replica computes the same split from the same reports;
- a small key (at most `reserved` seats for each replica it asks on) runs in the reserved
  slots of the replicas it asks on, smallest first, as far as they go: as with one gateway, whose
  reserved slot a quiet key takes, the pool (the flood's share) does not move when such a key
  comes and goes, so no replica is left above a share that shrank under it;
- any other key that asks on a replica has a share there, 0 included: only a key new to a
  replica (not reported yet) or a small one may take the reserved slots there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

Demand = Mapping[str, Mapping[str, int]]
"""Seats (running and waiting) of each key on each replica: replica -> key -> seats."""


@dataclass(frozen=True, slots=True)
class Shares:
    reserved: int
    keys: Mapping[str, Mapping[str, int]]
    """replica -> key -> seats it may run there."""
    lent: Mapping[str, int]
    """replica -> seats of the pool nobody wants, lent to it for what its small keys run in its
    reserved slots (so a key new to it still finds them while the engines have room)."""

    def key(self, replica: str, key: str) -> int:
        return self.keys.get(replica, {}).get(key, 0)

    def replica(self, replica: str) -> int:
        return self.reserved + self.lent.get(replica, 0) + sum(self.keys.get(replica, {}).values())


def share_slots(
    total: int,
    *,
    reserved: int,
    demand: Demand,
    weights: Mapping[str, float],
    running: Demand | None = None,
) -> Shares:
    """The shares of `total` slots for the replicas' `demand` (`weights`: a key's, default 1;
    `running`: the seats of each key each replica runs now, of its demand)."""
    running = running or {}
    replicas = sorted(demand)
    headroom = min(reserved, total // max(1, len(replicas)))
    pool = max(0, total - headroom * len(replicas))
    pooled, small = _beyond_headroom(demand, headroom)
    pool_wanted: dict[str, int] = {}
    for per_key in pooled.values():
        for key, count in per_key.items():
            pool_wanted[key] = pool_wanted.get(key, 0) + count
    cap = max(1, total - reserved)
    granted = _water_fill(pool, {k: min(n, cap) for k, n in pool_wanted.items()}, weights)
    # A key asking on a replica beyond its reserved slots has a share there, 0 included: only
    # a key new to a replica (not reported yet) or a small one may take its reserved slots.
    keys = {replica: dict.fromkeys(pooled[replica], 0) for replica in replicas}
    for key, share in granted.items():
        asks = [
            (replica, count, running.get(replica, {}).get(key, 0))
            for replica in replicas
            if (count := pooled[replica].get(key, 0)) > 0
        ]
        for replica, part in _split(share, asks).items():
            keys[replica][key] = part
    unwanted = pool - sum(granted.values())
    lent: dict[str, int] = {}
    for replica in replicas:
        if (seats := min(small[replica], unwanted)) > 0:
            lent[replica] = seats
            unwanted -= seats
    return Shares(headroom, keys, lent)


def _beyond_headroom(
    demand: Demand, headroom: int
) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """Each replica's demand less what its reserved slots take, and how many they take: the
    seats of the small keys, smallest then by name, while they fit. A key is small when its
    seats over all replicas are at most `headroom` per replica it asks on: a quiet key's
    requests on two replicas at once (or one a report behind the other) stay small, a flood's
    stray request on a second replica does not."""
    wanted: dict[str, int] = {}  # seats over all replicas
    asking: dict[str, int] = {}  # replicas asked on
    for per_key in demand.values():
        for key, count in per_key.items():
            if count > 0:
                wanted[key] = wanted.get(key, 0) + count
                asking[key] = asking.get(key, 0) + 1
    pooled: dict[str, dict[str, int]] = {}
    small: dict[str, int] = {}
    for replica, per_key in demand.items():
        room = headroom
        left = pooled[replica] = {}
        asks = [(key, count) for key, count in per_key.items() if count > 0]
        for key, count in sorted(asks, key=lambda item: (wanted[item[0]], item)):
            if wanted[key] <= headroom * asking[key] and count <= room:
                room -= count
            else:
                left[key] = count
        small[replica] = headroom - room
    return pooled, small


def _water_fill(
    pool: int, wanted: Mapping[str, int], weights: Mapping[str, float]
) -> dict[str, int]:
    """Whole seats for each key: weighted max-min fair, none above what it wants."""
    granted = {key: 0 for key in wanted}
    left = pool
    open_keys = sorted(key for key, count in wanted.items() if count > 0)
    while left > 0 and open_keys:
        weight_sum = sum(weights.get(key, 1.0) for key in open_keys)
        level = left / weight_sum
        # Keys that want less than their part at this level take what they want; the rest
        # share what is left in the next round.
        satisfied = [
            key for key in open_keys if wanted[key] - granted[key] <= level * weights.get(key, 1.0)
        ]
        if satisfied:
            for key in satisfied:
                left -= wanted[key] - granted[key]
                granted[key] = wanted[key]
            open_keys = [key for key in open_keys if key not in satisfied]
            continue
        parts = {key: level * weights.get(key, 1.0) for key in open_keys}
        whole = {key: math.floor(part) for key, part in parts.items()}
        for key, seats in whole.items():
            granted[key] += seats
        left -= sum(whole.values())
        # The seats the floors left, one each by the largest fraction (then name).
        order = sorted(open_keys, key=lambda key: (whole[key] - parts[key], key))
        for key in order[:left]:
            granted[key] += 1
        left = 0
    return granted


def _split(seats: int, asks: list[tuple[str, int, int]]) -> dict[str, int]:
    """`seats` split by the asks' sizes (replica, demand, running now). A replica keeps what
    it runs, up to its part rounded up (when that is too much in all, the one furthest above
    its part gives a seat back, and so on): a split that moved a seat from one replica to
    another at every small change of demand would leave the seat's old replica over its
    share (nothing is preempted), its reserved slot taken, and a key new to it waiting for
    a running request to end. The seats left by largest fraction (then name)."""
    total = sum(count for _, count, _ in asks)
    if total == 0:
        return {}
    parts = {replica: seats * count / total for replica, count, _ in asks}
    whole = {
        replica: max(math.floor(parts[replica]), min(now, math.ceil(parts[replica])))
        for replica, _, now in asks
    }
    while sum(whole.values()) > seats:  # kept too much: the furthest above its part gives one
        furthest = max(parts, key=lambda r: (whole[r] - parts[r], r))
        whole[furthest] -= 1
    left = seats - sum(whole.values())
    for replica in sorted(parts, key=lambda r: (whole[r] - parts[r], r))[:left]:
        whole[replica] += 1
    return whole
