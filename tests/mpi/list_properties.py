"""Properties of the list collectives against numpy, on cases drawn by
hypothesis.

A case is one call: all_reduce (division, inplace, 0 to 6 arrays), reduce
(a drawn dst, division, inplace), bcast (a drawn src, inplace),
all_gather (a list of receive arrays or ONE array of group size x count)
or reduce_scatter (a list, tuple or ONE send array, division). Arrays are
float32, float64, float16, int32 or int64, mixed within a list (division
only on floats, reduce_scatter in one dtype), of 0, 1 or a few odd
elements, and now and then one array within a few elements of 1 MiB,
where the fusion buffer gives way to reducing arrays where they lie.
Cases run on the world or on a group of some ranks in a drawn order (one
rank alone, reversed, ...), created when a case first needs it; ranks
outside the group skip the case.

Hypothesis runs on rank 0 only, derandomized and without an example
database, so each run draws the same cases; rank 0 collects them all
before any collective and broadcasts the list with mpi4py, so every rank
runs every case in the same order. Each rank's data is a pure function of
(case, array, world rank): every rank computes the numpy reference for the
whole group. Contributions are small integers, so sums are exact in every
dtype and compared for equality (float16 included); a mean is one rounding
off at most.

About a quarter of the all_reduce cases leave arrays zeroing on the ranks that
did not write them (over stale memory, so that reading it would show): an
array written on no rank of the group must stay zeroing and read as zeros,
one written on any rank is reduced everywhere, zeroing ranks adding zeros.

Usage: list_properties.py EXAMPLES_PER_COLLECTIVE
"""
import itertools
import sys

import numpy as np
from hypothesis import given, settings, strategies as st
from mpi4py import MPI

import nnabla as nn

from _harness import Checker, contribution, make_comm, nd, reference

FLOATS = ("float32", "float64", "float16")
DTYPES = FLOATS + ("int32", "int64")
OPS = ("all_reduce", "reduce", "bcast", "all_gather", "reduce_scatter")

SMALL_SHAPES = st.one_of(
    st.lists(st.sampled_from((1, 2, 3, 5, 7, 13)), max_size=3).map(tuple),
    st.sampled_from(((0,), (4, 0), (0, 3))))


def near_threshold(dtype):
    """One element under 1 MiB (still packed), exactly 1 MiB, and an odd
    count over it (both reduced where they lie)."""
    mib = (1 << 20) // np.dtype(dtype).itemsize
    return st.sampled_from(((mib - 1,), (mib,), (mib + 3,)))


@st.composite
def case(draw, n, op):
    ranks = draw(st.one_of(
        st.none(),
        st.permutations(range(n)).flatmap(
            lambda p: st.integers(1, n).map(lambda m: tuple(p[:m])))))
    k = n if ranks is None else len(ranks)
    c = {"op": op, "ranks": ranks}
    if op in ("all_reduce", "reduce", "reduce_scatter"):
        c["division"] = draw(st.booleans())
    if op in ("all_reduce", "reduce", "bcast"):
        c["inplace"] = draw(st.booleans())
        count = draw(st.integers(0, 6))
        forms = ("list", "tuple", "single") if count == 1 \
            else ("list", "tuple")
        c["form"] = draw(st.sampled_from(forms))
    else:
        count = 1
        forms = ("list", "one") if op == "all_gather" \
            else ("list", "tuple", "one")
        c["form"] = draw(st.sampled_from(forms))
        # The receive array's dtype and contents before the call must not
        # matter: never written (no dtype yet), uint8, or float64.
        c["stale"] = draw(st.sampled_from((None, "uint8", "float64")))
    if op == "reduce":
        c["dst"] = draw(st.integers(0, k - 1))
    if op == "bcast":
        c["src"] = draw(st.integers(0, k - 1))
    dtypes = st.sampled_from(FLOATS if c.get("division") else DTYPES)
    # At most one array near 1 MiB per case keeps the data small.
    large = None
    if count and draw(st.integers(0, 3)) == 3:
        large = draw(st.integers(0, count - 1))
    one_dtype = draw(dtypes) if op == "reduce_scatter" else None
    arrays = []
    for i in range(count):
        dt = one_dtype or draw(dtypes)
        shape = draw(near_threshold(dt) if i == large else SMALL_SHAPES)
        arrays.append((dt, shape))
    c["arrays"] = arrays
    if op in ("all_gather", "reduce_scatter"):
        # The receive arrays of all_gather and the one send array of
        # reduce_scatter: flat, or shaped as blocks of the sent shape.
        c["flat"] = draw(st.booleans())
    if op == "all_reduce" and draw(st.integers(0, 3)) == 0:
        # Group ranks (not world ranks) that write each array; a flag per
        # rank draws all, none and some about as often.
        c["writers"] = [
            [g for g, w in enumerate(draw(st.lists(
                st.booleans(), min_size=k, max_size=k))) if w]
            for _ in arrays]
    return c


def draw_cases(n, examples):
    """`examples` cases of each collective (one strategy over all of them
    draws some far more often than others), interleaved so that each
    collective also runs after every other one on the same fusion buffer
    and groups."""
    per_op = []
    for op in OPS:
        cases = []

        @settings(derandomize=True, database=None, max_examples=examples,
                  deadline=None)
        @given(case(n, op))
        def collect(c):
            cases.append(c)

        collect()
        per_op.append(cases)
    return [c for batch in itertools.zip_longest(*per_op) for c in batch
            if c is not None]


def key(index, slot, shape):
    # Arrays near 1 MiB share their data across cases (it depends on shape
    # and dtype still), so that the harness's cache of large contributions
    # stays bounded.
    return "large" if np.prod(shape) >= 4096 else f"{index}/{slot}"


def fresh(shape, stale):
    if stale is None:
        return nn.NdArray(shape)
    return nd(np.full(shape, 77, stale))


def pack(mine, form):
    if form == "single":
        return mine[0]
    return tuple(mine) if form == "tuple" else list(mine)


class Runner:
    """Runs the cases on this rank; keeps the groups made so far."""

    def __init__(self, ck, comm):
        self.ck, self.comm = ck, comm
        self.groups = {}

    def group(self, ranks):
        """The name of the group of `ranks` (None: the world), made by
        every rank the first time a case needs it."""
        if ranks is None:
            return "world"
        name = self.groups.get(ranks)
        if name is None:
            name = "p" + "_".join(map(str, ranks))
            self.ck.equal(self.comm.new_group((name, list(ranks))), name,
                          f"new_group(({name!r}, {list(ranks)}))")
            self.groups[ranks] = name
        return name

    def run(self, index, c):
        group = self.group(c["ranks"])
        ranks = list(range(self.comm.size)) if c["ranks"] is None \
            else list(c["ranks"])
        if self.comm.rank not in ranks:
            return
        label = f"case {index} {c!r}"
        getattr(self, c["op"])(c, group, ranks, index, label)

    def all_reduce(self, c, group, ranks, index, label):
        ck, me = self.ck, self.comm.rank
        writers = c.get("writers") or [range(len(ranks))] * len(c["arrays"])
        keys = [key(index, i, s) for i, (_, s) in enumerate(c["arrays"])]
        mine = []
        for k, (dt, shape), w in zip(keys, c["arrays"], writers):
            if ranks.index(me) in w:
                mine.append(nd(contribution(k, me, shape, dt)))
            else:
                # astype: a 0-d array plus 50 is a float64 scalar.
                x = nd((contribution(k + "/stale", me, shape, dt) + 50)
                       .astype(dt))
                x.zero()
                mine.append(x)
        self.comm.all_reduce(pack(mine, c["form"]), division=c["division"],
                             inplace=c["inplace"], group=group)
        for i, (x, k, (dt, shape), w) in enumerate(
                zip(mine, keys, c["arrays"], writers)):
            what = f"{label} [{i}]"
            if not w:
                # The flag first: reading .data would clear it.
                ck.true(x.zeroing, what + ": written nowhere, still zeroing")
                ck.array(x, np.zeros(shape), what + ": zeros", dt)
                continue
            if c.get("writers"):
                ck.true(not x.zeroing, what + ": written, no longer zeroing")
            contribs = [contribution(k, r, shape, dt) if g in w
                        else np.zeros(shape, dt)
                        for g, r in enumerate(ranks)]
            ref, tol = reference(contribs, dt, c["division"])
            ck.array(x, ref, what, dt, tol)

    def reduce(self, c, group, ranks, index, label):
        me = self.comm.rank
        keys = [key(index, i, s) for i, (_, s) in enumerate(c["arrays"])]
        before = [contribution(k, me, s, dt)
                  for k, (dt, s) in zip(keys, c["arrays"])]
        mine = [nd(a) for a in before]
        self.comm.reduce(pack(mine, c["form"]), c["dst"],
                         division=c["division"], inplace=c["inplace"],
                         group=group)
        for i, (x, k, (dt, shape)) in enumerate(
                zip(mine, keys, c["arrays"])):
            if me == ranks[c["dst"]]:
                ref, tol = reference(
                    [contribution(k, r, shape, dt) for r in ranks], dt,
                    c["division"])
                self.ck.array(x, ref, f"{label} [{i}] root", dt, tol)
            else:
                self.ck.array(x, before[i],
                              f"{label} [{i}] non-root unchanged", dt)

    def bcast(self, c, group, ranks, index, label):
        keys = [key(index, i, s) for i, (_, s) in enumerate(c["arrays"])]
        mine = [nd(contribution(k, self.comm.rank, s, dt))
                for k, (dt, s) in zip(keys, c["arrays"])]
        self.comm.bcast(pack(mine, c["form"]), c["src"],
                        inplace=c["inplace"], group=group)
        for i, (x, k, (dt, shape)) in enumerate(
                zip(mine, keys, c["arrays"])):
            self.ck.array(x, contribution(k, ranks[c["src"]], shape, dt),
                          f"{label} [{i}]", dt)

    def all_gather(self, c, group, ranks, index, label):
        (dt, shape), = c["arrays"]
        k, n = key(index, 0, shape), len(ranks)
        count = int(np.prod(shape))
        send_np = contribution(k, self.comm.rank, shape, dt)
        send = nd(send_np)
        blocks = [contribution(k, r, shape, dt) for r in ranks]
        if c["form"] == "one":
            recv_shape = (n * count,) if c["flat"] else (n,) + shape
            one = fresh(recv_shape, c["stale"])
            self.comm.all_gather(send, one, group=group)
            expected = np.concatenate([b.reshape(-1) for b in blocks])
            self.ck.array(one, expected.reshape(recv_shape),
                          f"{label} into one array", dt)
        else:
            recv_shape = (count,) if c["flat"] else shape
            recv = [fresh(recv_shape, c["stale"]) for _ in ranks]
            self.comm.all_gather(send, recv, group=group)
            for i, x in enumerate(recv):
                self.ck.array(x, blocks[i].reshape(recv_shape),
                              f"{label} recv[{i}] (world rank {ranks[i]})",
                              dt)
        self.ck.array(send, send_np, f"{label} send unchanged", dt)

    def reduce_scatter(self, c, group, ranks, index, label):
        (dt, shape), = c["arrays"]
        n, me = len(ranks), ranks.index(self.comm.rank)
        k = key(index, 0, shape)
        full = (n,) + shape
        mine_np = contribution(k, self.comm.rank, full, dt)
        if c["form"] == "one":
            flat = mine_np.reshape(-1) if c["flat"] else mine_np
            send = [nd(flat)]
            data = send[0]
        else:
            send = [nd(mine_np[i]) for i in range(n)]
            data = pack(send, c["form"])
        recv = fresh(shape, c["stale"])
        self.comm.reduce_scatter(data, recv, division=c["division"],
                                 group=group)
        ref, tol = reference([contribution(k, r, full, dt)[me]
                              for r in ranks], dt, c["division"])
        self.ck.array(recv, ref, f"{label} (group rank {me})", dt, tol)
        got = np.concatenate([np.array(s.data).reshape(-1) for s in send])
        self.ck.true(np.array_equal(got, mine_np.reshape(-1)),
                     f"{label}: send arrays unchanged")


def main():
    ck = Checker("list_properties")
    comm, _ = make_comm()
    world = MPI.COMM_WORLD
    examples = int(sys.argv[1])
    cases = world.bcast(draw_cases(comm.size, examples)
                        if world.rank == 0 else None, root=0)
    runner = Runner(ck, comm)
    for index, c in enumerate(cases):
        runner.run(index, c)
    if world.rank == 0:
        print(f"list_properties: {len(cases)} examples, {examples} per "
              f"collective", flush=True)
    ck.finish()


main()
