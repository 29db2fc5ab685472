"""A plain-Python model of the lab cache (`prefixcache._core.LabCache`), for differential
tests: every block is a dict entry holding every field, and each eviction picks the least
key computed afresh from the blocks' current fields. It follows the rules of
rust/prefixcache-core/src/lab/cache.rs (eviction order, ties to the deeper block then the
lower slot, slots reused last freed first, admission, segments, GDSF aging, hit density)
without its storage (side arrays per rule, the evictable set, the key map, the seen
table, the lazily built protected order)."""

from __future__ import annotations

from dataclasses import dataclass

from prefixcache.errors import BlockStateError, InvalidInputError, UnknownRequestError

NONE = 2**32 - 1
NEVER = 2**64 - 1
U64 = 2**64 - 1
BINS = 64
CLASSES = 3
PERIOD = 128


def age_bin(age: int) -> int:
    if age < 3:
        return age
    a = age + 1
    lg = a.bit_length() - 1
    frac = (a >> (lg - 2)) & 3
    return min(lg * 4 + frac, BINS - 1)


def bin_age(b: int) -> float:
    if b < 8:
        return float(min(b, 3))
    lg, frac = b // 4, float(b % 4)
    return max((4.0 + frac) * float(1 << lg) / 4.0 - 1.0, 0.0)


def use_class(uses: int) -> int:
    return min(max(uses, 1) - 1, CLASSES - 1)


class DensityModel:
    def __init__(self) -> None:
        self.hits = [0.0] * (CLASSES * BINS)
        self.evictions = [0.0] * (CLASSES * BINS)
        self.density = [0.0] * (CLASSES * BINS)
        self.last_update = 0

    def get(self, c: int, age: int) -> float:
        return self.density[c * BINS + age_bin(age)]

    def maybe_update(self, clock: int) -> None:
        if clock < self.last_update + PERIOD:
            return
        self.last_update = clock
        for c in range(CLASSES):
            o = c * BINS
            for b in range(BINS):
                base = bin_age(b)
                num = den = 0.0
                for x in range(b, BINS):
                    num += self.hits[o + x]
                    den += (self.hits[o + x] + self.evictions[o + x]) * (bin_age(x) - base + 1.0)
                self.density[o + b] = num / den if den > 0.0 else 0.0
        self.hits = [v * 0.9 for v in self.hits]
        self.evictions = [v * 0.9 for v in self.evictions]


@dataclass
class Block:
    key: int
    parent: int
    depth: int
    children: int = 0
    refs: int = 0
    protected: bool = False
    listed: bool = False
    uses: int = 0
    last: int = 0
    next_use: int = NEVER
    hits: int = 0
    priority: float = 0.0
    seen: int = 0


class LabModel:
    def __init__(
        self,
        capacity: int,
        rule: str = "lru",
        admit_after: int | None = None,
        overcommit: bool = False,
        protected: float = 0.8,
        depth_cost: float = 0.0,
        min_hit: float = 0.25,
    ) -> None:
        self.capacity = capacity
        self.rule = rule
        self.admit = admit_after if admit_after is not None and admit_after > 1 else 0
        self.overcommit = overcommit
        self.depth_cost = depth_cost
        self.min_hit = min_hit
        self.protected_cap = int(capacity * protected) if rule in ("slru", "session") else 0
        self.window_cap = int(capacity * 0.05) if rule == "2q" else 0
        self.blocks: dict[int, Block] = {}  # live blocks by slot
        self.num_slots = 0
        self.free_slots: list[int] = []
        self.by_key: dict[int, int] = {}
        self.used = 0
        self.clock = 0
        self.held: dict[int, tuple[list[int], int]] = {}
        self.seen: dict[int, int] = {}
        self.future: list[tuple[list[int], int]] | None = None
        self.aging = 0.0
        self.density = DensityModel()
        self.pool: list[int] = []
        self.rng = 0x9E3779B97F4A7C15
        self.evicted = 0
        self.not_admitted = 0
        self.hit_blocks = 0

    # ----- observations -------------------------------------------------------------

    @property
    def cached(self) -> int:
        return sum(1 for b in self.blocks.values() if b.refs == 0)

    @property
    def num_free(self) -> int:
        return self.capacity - self.used

    def counts_keys(self) -> bool:
        return self.admit > 0 or self.rule == "2q"

    def lookup(self, keys: list[int], hittable: int) -> int:
        n = 0
        for k in keys[: min(hittable, len(keys))]:
            if k not in self.by_key:
                break
            n += 1
        return n

    def stats(self) -> dict[str, int]:
        return {
            "evicted": self.evicted,
            "not_admitted": self.not_admitted,
            "cached": self.cached,
            "used": self.used,
            "hit_blocks": self.hit_blocks,
        }

    def set_future(self, requests: list[tuple[list[int], int]]) -> None:
        self.future = requests

    def future_at(self, rid: int, pos: int) -> int:
        if self.future is None or rid >= len(self.future):
            return NEVER
        keys = self.future[rid][0]
        if pos >= len(keys):
            return NEVER
        k = keys[pos]
        for r in range(rid + 1, len(self.future)):
            ks, h = self.future[r]
            if k in ks[:h]:
                return r
            if k in ks:  # brought again outside the hittable prefix, at no cost
                return NEVER
        return NEVER

    # ----- eviction order -----------------------------------------------------------

    def evict_key(self, s: int) -> tuple[object, ...]:
        b = self.blocks[s]
        last = 0 if self.rule == "opt" else b.last
        r = self.rule
        p: object
        if r == "lru":
            p, q = last, 0
        elif r == "opt":
            p, q = U64 - b.next_use, 0
        elif r in ("slru", "session", "2q"):
            p, q = int(b.protected), last
        elif r == "lfu":
            p, q = b.hits, last
        elif r == "density":
            p, q = 0, 0
        else:
            p, q = b.priority, last
        return (p, q, NONE - b.depth, s)

    def list(self, s: int) -> None:
        self.blocks[s].listed = True
        if self.rule == "density":
            self.pool.append(s)

    def unlist(self, s: int) -> None:
        b = self.blocks[s]
        if b.listed:
            b.listed = False
            if self.rule == "density":
                i = self.pool.index(s)
                self.pool[i] = self.pool[-1]
                self.pool.pop()

    def next_random(self) -> int:
        x = self.rng
        x ^= (x << 13) & U64
        x ^= x >> 7
        x ^= (x << 17) & U64
        self.rng = x
        return x

    def density_victim(self) -> int | None:
        n = len(self.pool)
        if n == 0:
            return None
        draws = 64
        best: tuple[float, int, int, int] | None = None
        for i in range(min(draws, n)):
            idx = i if n <= draws else self.next_random() % n
            s = self.pool[idx]
            b = self.blocks[s]
            age = self.clock - min(b.last, self.clock)
            d = self.density.get(use_class(b.uses), age)
            if best is None or (
                d < best[0]
                or (d == best[0] and (age > best[1] or (age == best[1] and b.depth > best[2])))
            ):
                best = (d, age, b.depth, s)
        return None if best is None else best[3]

    def window_len(self) -> int:
        return sum(1 for b in self.blocks.values() if not b.protected)

    def evict_one(self) -> bool:
        listed = [s for s, b in self.blocks.items() if b.listed]
        if self.rule == "density":
            slot = self.density_victim()
        elif self.rule == "2q" and self.window_len() <= self.window_cap:
            main = [s for s in listed if self.blocks[s].protected]
            pick = main or listed
            slot = min(pick, key=self.evict_key) if pick else None
        else:
            slot = min(listed, key=self.evict_key) if listed else None
        if slot is None:
            return False
        self.unlist(slot)
        b = self.blocks[slot]
        if self.rule == "density":
            age = self.clock - min(b.last, self.clock)
            self.density.evictions[use_class(b.uses) * BINS + age_bin(age)] += 1.0
        if self.rule == "cost":
            self.aging = max(self.aging, b.priority)
        self.free(slot)
        self.evicted += 1
        return True

    def free(self, s: int) -> None:
        b = self.blocks.pop(s)
        if self.counts_keys():
            self.seen[b.key] = b.seen
        del self.by_key[b.key]
        self.free_slots.append(s)
        self.used -= 1
        self.detach_child(b.parent)

    def detach_child(self, parent: int) -> None:
        if parent != NONE:
            p = self.blocks[parent]
            p.children -= 1
            if p.children == 0 and p.refs == 0:
                self.list(parent)

    def new_block(self, key: int, parent: int, depth: int) -> int:
        s = self.free_slots.pop() if self.free_slots else self.num_slots
        if s == self.num_slots:
            self.num_slots += 1
        b = Block(key, parent, depth)
        if self.counts_keys():
            b.seen = self.seen.pop(key, 0)
        self.blocks[s] = b
        if parent != NONE:
            self.blocks[parent].children += 1
        self.by_key[key] = s
        self.used += 1
        return s

    def pin(self, s: int) -> None:
        self.unlist(s)
        self.blocks[s].refs += 1

    def unpin_restore(self, s: int) -> None:
        b = self.blocks[s]
        b.refs -= 1
        if b.refs == 0 and b.children == 0:
            self.list(s)

    def protect(self, s: int) -> None:
        b = self.blocks[s]
        if b.protected:
            return
        b.protected = True
        if self.rule == "2q":
            return
        while sum(1 for x in self.blocks.values() if x.protected) > self.protected_cap:
            d = min((x.last, t) for t, x in self.blocks.items() if x.protected)[1]
            self.blocks[d].protected = False
            self.blocks[d].last = self.clock

    def touch(self, s: int, rid: int, hit: bool, promote: bool) -> None:
        b = self.blocks[s]
        if self.rule == "opt":
            nxt = self.future_at(rid, b.depth)
            b.next_use = nxt if nxt < NONE else NEVER
        if self.rule == "density":
            if b.uses > 0:
                age = self.clock - min(b.last, self.clock)
                self.density.hits[use_class(b.uses) * BINS + age_bin(age)] += 1.0
            b.uses = min(b.uses + 1, 3)
        b.last = self.clock
        if hit and self.rule in ("lfu", "cost"):
            b.hits += 1
        if self.rule == "cost":
            cost = 1.0 + self.depth_cost * (float(b.depth) + 0.5)
            b.priority = self.aging + (float(b.hits) + 1.0) * cost
        if not b.protected and promote:
            self.protect(s)
        if self.counts_keys():
            b.seen += 1
            if b.seen >= 2 and self.rule == "2q":
                self.protect(s)

    # ----- operations ---------------------------------------------------------------

    def check_chain(self, keys: list[int], parent: int) -> None:
        gone = False
        for k in keys:
            s = self.by_key.get(k)
            if s is None:
                gone = True
            elif not gone and self.blocks[s].parent == parent:
                parent = s
            else:
                raise InvalidInputError(f"key {k} is cached after another key")

    def acquire(self, rid: int, keys: list[int], hittable: int, total: int) -> int | None:
        if self.rule == "opt" and self.future is None:
            raise InvalidInputError("the opt rule needs the future")
        if rid in self.held:
            raise InvalidInputError(f"request {rid} already holds blocks")
        if hittable > len(keys) or total < len(keys):
            raise InvalidInputError("hittable and total must bracket the keys")
        if len(set(keys)) != len(keys):
            raise InvalidInputError("a key repeats")
        self.check_chain(keys, NONE)
        anon = total - len(keys)
        hit = self.lookup(keys, hittable)
        present = [self.by_key.get(k) for k in keys]
        for s in present:
            if s is not None:
                self.pin(s)
        need = sum(1 for s in present if s is None) + anon
        if not self.overcommit:
            free = max(self.capacity - self.used, 0)
            if need > free and need - free > self.cached:
                for s in present:
                    if s is not None:
                        self.unpin_restore(s)
                return None
            for _ in range(free, need):
                self.evict_one()
        self.clock += 1
        if self.rule == "density":
            self.density.maybe_update(self.clock)
        session = self.rule == "session" and hit > 0 and hit >= self.min_hit * hittable
        parent = NONE
        slots = []
        for i, (k, p) in enumerate(zip(keys, present, strict=True)):
            if p is None:
                s = self.new_block(k, parent, i)
                self.blocks[s].refs = 1
            else:
                s = p
            promote = (self.rule == "slru" and i < hit) or session
            self.touch(s, rid, i < hit, promote)
            slots.append(s)
            parent = s
        self.used += anon
        self.hit_blocks += hit
        self.held[rid] = (slots, anon)
        return hit

    def grow(self, rid: int, new_keys: list[int], total: int) -> bool:
        if rid not in self.held:
            raise UnknownRequestError(f"request {rid} holds no blocks")
        blocks, old_anon = self.held[rid]
        keyed = len(blocks) + len(new_keys)
        if total < keyed:
            raise InvalidInputError("total below the keyed blocks")
        if len(set(new_keys)) != len(new_keys):
            raise InvalidInputError("a key repeats")
        if any(self.by_key.get(k) in blocks for k in new_keys):
            raise InvalidInputError("a key is already one of the request's blocks")
        parent = blocks[-1] if blocks else NONE
        self.check_chain(new_keys, parent)
        present = [self.by_key.get(k) for k in new_keys]
        for s in present:
            if s is not None:
                self.pin(s)
        anon = total - keyed
        need = sum(1 for s in present if s is None) + anon - old_anon
        if not self.overcommit and need > 0:
            free = max(self.capacity - self.used, 0)
            if need > free and need - free > self.cached:
                for s in present:
                    if s is not None:
                        self.unpin_restore(s)
                return False
            for _ in range(free, need):
                self.evict_one()
        self.clock += 1
        depth0 = len(blocks)
        for i, (k, p) in enumerate(zip(new_keys, present, strict=True)):
            if p is None:
                s = self.new_block(k, parent, depth0 + i)
                self.blocks[s].refs = 1
            else:
                s = p
            b = self.blocks[s]
            up = s if b.parent == NONE else b.parent
            promote = self.rule == "session" and self.blocks[up].protected
            self.touch(s, rid, False, promote)
            blocks.append(s)
            parent = s
        self.used += anon - old_anon
        self.held[rid] = (blocks, anon)
        return True

    def release(self, rid: int) -> None:
        if rid not in self.held:
            raise UnknownRequestError(f"request {rid} holds no blocks")
        blocks, anon = self.held.pop(rid)
        self.used -= anon
        for s in reversed(blocks):
            b = self.blocks[s]
            b.refs -= 1
            if b.refs > 0 or b.children > 0:
                continue
            if self.admit == 0 or b.seen >= self.admit:
                self.list(s)
            else:
                self.free(s)
                self.not_admitted += 1
        if self.overcommit:
            while self.used > self.capacity and self.evict_one():
                pass

    def set_overcommit(self, on: bool) -> None:
        if not on and self.used > self.capacity:
            held = self.used - self.cached
            if held > self.capacity:
                raise BlockStateError("running requests hold more than the capacity")
            while self.used > self.capacity and self.evict_one():
                pass
        self.overcommit = on
