"""Sparse gradients: sparse_all_reduce against numpy, and DistributedSolver
reducing embedding tables sparsely as one process at the whole batch.

sparse_all_reduce: every rank's table gradient is zero outside rows of its
own (one rank touches none), small integers so that sums are exact; the
result must equal the numpy sum (or mean) of the ranks' dense tables, on
the world and a sub-group. Rows outside the table, or tables of different
sizes, raise ValueError on every rank.

DistributedSolver: a model with an embedding (PF.embed) and an affine
layer, 5 Momentum steps, each rank on its slice of a global batch, against
one process at the whole batch; the table must go through
sparse_all_reduce (counted) unless sparse_as_dense, or when the graph also
uses it densely (a weight-decay term on the table), where it must not.
"""
import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S

import nncomm
import nncomm.distributed_solver

from _harness import Checker, make_comm, nd

VOCAB, DIM, BATCH, STEPS = 40, 3, 12, 5


def rows_of(rank):
    """Rank `rank`'s touched rows; rank 1 touches none."""
    if rank == 1:
        return np.zeros(0, np.int64)
    rng = np.random.default_rng(rank)
    return rng.choice(VOCAB, size=5 + rank, replace=False)


def table_of(rank):
    t = np.zeros((VOCAB, DIM), np.float32)
    rows = rows_of(rank)
    t[rows] = np.random.default_rng(50 + rank).integers(
        -8, 9, (rows.size, DIM))
    return t


def direct(ck, comm, group, ranks):
    if comm.rank not in ranks:
        return
    for division in (False, True):
        grad = nd(table_of(comm.rank))
        nncomm.sparse_all_reduce(comm, grad, rows_of(comm.rank),
                                 division=division, group=group)
        total = np.sum([table_of(r) for r in ranks], axis=0)
        expected = total / np.float32(len(ranks)) if division else total
        ck.array(grad, expected.astype(np.float32),
                 f"sparse_all_reduce on {group}, division={division}",
                 tol=np.abs(expected) * 2e-7 if division else None)
    bad = np.array([VOCAB]) if comm.rank == ranks[-1] else rows_of(0)
    ck.raises(ValueError, "outside the table", f"{group}: a row past the "
              f"end on one rank", nncomm.sparse_all_reduce, comm,
              nd(table_of(0)), bad, group=group)
    if len(ranks) > 1:
        rows = VOCAB + (comm.rank == ranks[0])
        ck.raises(ValueError, "tables differ", f"{group}: tables differ",
                  nncomm.sparse_all_reduce, comm,
                  nd(np.zeros((rows, DIM), np.float32)), [0], group=group)


def model(scope, batch, decay):
    ids, t = nn.Variable((batch, 2)), nn.Variable((batch, 1))
    with nn.parameter_scope(scope):
        e = PF.embed(ids, VOCAB, DIM)
        y = PF.affine(F.tanh(e), 1)
        params = nn.get_parameters()
    loss = F.mean(F.squared_error(y, t))
    if decay:
        loss = loss + 1e-2 * F.sum(params["embed/W"] ** 2)
    return ids, t, loss, params


def counting(calls):
    """sparse_all_reduce, noting the rows of each call in `calls`."""
    def counted(*args, **kwargs):
        calls.append(args[2])
        return nncomm.sparse_all_reduce(*args, **kwargs)
    return counted


def solver_case(ck, comm, what, decay=False, **options):
    nn.clear_parameters()
    shard = BATCH // comm.size
    ids, t, loss, params = model("dp", shard, decay)
    rids, rt, rloss, rparams = model("ref", BATCH, decay)
    for name, v in params.items():
        rparams[name].d = v.d
    solver = nncomm.DistributedSolver(S.Momentum(0.5, 0.9), comm, **options)
    solver.set_parameters(params)
    reference = S.Momentum(0.5, 0.9)
    reference.set_parameters(rparams)
    calls = []
    nncomm.distributed_solver.sparse_all_reduce = counting(calls)
    try:
        for step in range(STEPS):
            rng = np.random.default_rng(step)
            # Few distinct ids, so that ranks touch overlapping rows.
            X = rng.integers(0, VOCAB // 4, (BATCH, 2))
            T = rng.standard_normal((BATCH, 1)).astype(np.float32)
            mine = slice(comm.rank * shard, (comm.rank + 1) * shard)
            ids.d, t.d = X[mine], T[mine]
            loss.forward()
            solver.zero_grad()
            solver.backward(loss, clear_buffer=True)
            solver.update()
            rids.d, rt.d = X, T
            rloss.forward()
            reference.zero_grad()
            rloss.backward(clear_buffer=True)
            reference.update()
            for name, v in params.items():
                ck.true(np.allclose(v.d, rparams[name].d, rtol=1e-5,
                                    atol=1e-6),
                        f"{what}: step {step} {name}",
                        f"max difference "
                        f"{np.max(np.abs(v.d - rparams[name].d)):.3g}")
    finally:
        nncomm.distributed_solver.sparse_all_reduce = \
            nncomm.sparse_all_reduce
    sparse = not decay and not options.get("sparse_as_dense")
    ck.equal(len(calls), STEPS if sparse else 0,
             f"{what}: steps reduced sparsely")


def main():
    ck = Checker("sparse")
    comm, _ = make_comm()
    direct(ck, comm, "world", list(range(comm.size)))
    if comm.size >= 3:
        ranks = [comm.size - 1, 0, 1]
        comm.new_group(("three", ranks))
        direct(ck, comm, "three", ranks)
    if BATCH % comm.size == 0:
        solver_case(ck, comm, "sparse table")
        solver_case(ck, comm, "sparse_as_dense", sparse_as_dense=True)
        solver_case(ck, comm, "table also used densely", decay=True)
    ck.finish()


main()
