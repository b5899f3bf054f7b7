"""The two-level all-reduce (NNCOMM_HIERARCHICAL) against numpy, on ranks
that span hosts (tests/test_hierarchical.py runs it on two emulated hosts
of two ranks each) or on one host.

Usage: two_level.py PATH, PATH being the path the world's all-reduces
must take: "two_level" or "flat" (read from this rank's flight record,
where the operation is named). On 4 ranks it also checks the groups
"reversed" (every rank, as the world: same path) and "gapped" (ranks 3, 0
and 2: two on one host and one on the other, in blocks or alternating,
always flat).

Checked, against numpy sums of every rank's contribution: all_reduce of a
list (fused into one message), packed and in place, sum and mean,
float32 (small integers: bit for bit), float16 and float32 (random:
within the rounding bound), odd counts, an empty array and one above the
direct threshold (reduced where it lies, in pieces when
NNCOMM_CHUNK_BYTES is small); and all_reduce_callback's buckets on an
MLP with scale_grad, against the gradients of every rank.
"""
import glob
import json
import os
import sys
import tempfile

import numpy as np

from _harness import (Checker, big_count, contribution, dtype_name,
                      expected_sum, make_comm, mlp, nd, scaled_reference,
                      world_gather)

PATH = sys.argv[1]
SHAPES = [(7,), (0,), (3, 5), (1,)]


def lists(ck, comm, group, ranks):
    """all_reduce of lists, every form, against numpy."""
    for dt, kind in [(np.float32, "int"), (np.float32, "rand"),
                     (np.float16, "rand"), (np.int32, "int")]:
        shapes = SHAPES + [(big_count(dt),)]
        for division in (False, True):
            if division and dt is np.int32:
                continue
            for inplace in (False, True):
                key = f"{group}/{dtype_name(dt)}/{kind}/{division}/{inplace}"
                keys = [f"{key}/{i}" for i in range(len(shapes))]
                mine = [nd(contribution(k, comm.rank, s, dt, kind))
                        for k, s in zip(keys, shapes)]
                comm.all_reduce(mine, division=division, inplace=inplace,
                                group=group)
                for x, k, s in zip(mine, keys, shapes):
                    ref, tol = expected_sum(k, ranks, s, dt, division, kind)
                    ck.array(x, ref, f"all_reduce group={group} "
                             f"{dtype_name(dt)}{s} {kind} division="
                             f"{division} inplace={inplace}", dt, tol)


def callback(ck, comm):
    """all_reduce_callback's buckets (several: pack_size 16) on an MLP."""
    for scale, division in [(1.0, False), (0.25, True)]:
        x, t, loss, params = mlp(f"mlp{scale}", 4, seed=3)
        x.d = contribution(f"x{scale}", comm.rank, x.shape, np.float32,
                           "rand")
        t.d = contribution(f"t{scale}", comm.rank, t.shape, np.float32,
                           "rand")
        grads = [p.grad for p in params.values()]
        loss.forward()
        for p in params.values():
            p.grad.zero()
        loss.backward()
        everyone = world_gather(grads)
        cb = comm.all_reduce_callback(grads, 16, division=division,
                                      scale_grad=scale)
        loss.forward()
        for p in params.values():
            p.grad.zero()
        loss.backward(function_post_hook=cb)
        for i, name in enumerate(params):
            ref, tol = scaled_reference([e[i] for e in everyone], scale,
                                        division)
            ck.array(grads[i], ref, f"callback scale_grad={scale} "
                     f"division={division} {name}", np.float32, tol)


def paths(comm):
    """Each transport's path, from this rank's flight record: the group
    (world ranks) -> whether its all-reduces ran in two levels."""
    folder = tempfile.mkdtemp()
    comm.dump_flight_record(folder)
    [path] = glob.glob(os.path.join(folder, "*.json"))
    with open(path) as f:
        record = json.load(f)
    found = {}
    for transport in record["groups"]:
        ops = {op["op"] for op in transport["records"]}
        if ops & {"allreduce", "hierarchical_allreduce"}:
            key = tuple(transport["world_ranks"])
            found[key] = found.get(key, False) or \
                "hierarchical_allreduce" in ops
    return found


def main():
    ck = Checker("two_level")
    comm, _ = make_comm()
    n = comm.size
    groups = [("world", list(range(n)))]
    if n == 4:
        groups += [("reversed", [3, 2, 1, 0]), ("gapped", [3, 0, 2])]
        for name, ranks in groups[1:]:
            comm.new_group((name, ranks))
    for group, ranks in groups:
        if comm.rank in ranks:
            lists(ck, comm, group, ranks)
    callback(ck, comm)
    found = paths(comm)
    two_level = PATH == "two_level"
    ck.equal(found.get(tuple(range(n))), two_level,
             f"the world's all-reduces run in two levels: {two_level}")
    if n == 4:
        ck.equal(found.get((3, 2, 1, 0)), two_level,
                 "group reversed: as the world")
        if comm.rank in (3, 0, 2):
            ck.equal(found.get((3, 0, 2)), False,
                     "group gapped (uneven hosts): flat")
    ck.finish()


main()
