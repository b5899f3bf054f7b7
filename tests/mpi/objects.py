"""broadcast_parameters, broadcast_solver_state, broadcast_object,
allgather_object and the communicator's workers, is_main, is_capable and
finalize, on the world and the standard sub-groups (roots that are not
world rank 0 included).

Every rank starts from values of its own, so a result equal to the root's
bit for bit shows that it came from the root. Bad input (a root out of
range, an object that does not pickle or unpickle, parameters or states
that differ) must raise on every rank of the group; a correct call right
after each shows that no rank was left inside a collective.
"""
import pickle
import threading

import numpy as np
from mpi4py import MPI

import nnabla as nn
import nnabla.solvers as S

import nncomm
from _harness import contribution, make_comm, start

# Floats whose bits a conversion would change: NaN with a payload, -0.0,
# infinities and subnormals.
SPECIAL = np.array([0x7FC00123, 0x80000000, 0x7F800000, 0xFF800000, 1],
                   np.uint32).view(np.float32)


def values(key, rank, shape, dtype=np.float32):
    """Rank `rank`'s values for `key`, special floats included."""
    a = contribution(key, rank, shape, dtype, "rand").copy()
    flat = a.reshape(-1)
    n = min(flat.size, SPECIAL.size)
    flat[:n] = SPECIAL[:n].astype(dtype)
    return a


def same_bits(got, expected):
    got, expected = np.asarray(got), np.asarray(expected)
    return got.dtype == expected.dtype and got.shape == expected.shape \
        and got.tobytes() == expected.tobytes()


def variable(array):
    v = nn.Variable(array.shape, need_grad=True)
    v.data.cast(array.dtype)[...] = array
    return v


SHAPES = {"conv/W": (4, 3, 3, 3), "conv/b": (4,), "fc/W": (300, 70),
          "fc/b": (70,), "scalar": ()}
DTYPES = {"fc/W": np.float16, "scalar": np.float64}


def model(key, rank):
    """Rank `rank`'s parameters for `key`: a dict in an order of its own,
    since a dict is matched by name."""
    names = sorted(SHAPES)
    order = np.random.default_rng(rank).permutation(len(names))
    return {names[i]: variable(values(f"{key}/{names[i]}", rank,
                                      SHAPES[names[i]],
                                      DTYPES.get(names[i], np.float32)))
            for i in order}


def parameters(ck, comm, groups):
    for name, ranks in groups:
        for root, source in enumerate(ranks):
            key = f"params/{name}/{root}"
            params = model(key, comm.rank)
            nncomm.broadcast_parameters(comm, params, root, group=name)
            for p, v in params.items():
                ck.true(same_bits(v.d, values(
                    f"{key}/{p}", source, SHAPES[p],
                    DTYPES.get(p, np.float32))),
                    f"broadcast_parameters on {name}{ranks} root={root}: "
                    f"{p} holds world rank {source}'s bits")
        # A list is matched by position: every rank lists them by name.
        as_list = [v for _, v in sorted(model(f"list/{name}",
                                              comm.rank).items())]
        # The first one twice, as tied weights may be listed.
        nncomm.broadcast_parameters(comm, as_list + as_list[:1], group=name)
        expected = [v for _, v in sorted(model(f"list/{name}",
                                               ranks[0]).items())]
        ck.true(all(same_bits(v.d, e.d) for v, e in zip(as_list, expected)),
                f"broadcast_parameters of a list on {name}{ranks}")


SOLVERS = {"Adam": S.Adam, "Momentum": lambda: S.Momentum(0.1),
           "Sgd": S.Sgd}


def solver_for(kind, key, rank):
    """A solver of `kind` over parameters for `key`, whose state (every
    pstate array and t) is rank `rank`'s own."""
    solver = SOLVERS[kind]()
    solver.set_parameters(model(key, rank))
    states = solver.get_states()
    for i, (name, state) in enumerate(sorted(states.items())):
        for k, v in state.pstate.items():
            v.data.cast(np.float32)[...] = values(
                f"{key}/{name}/{k}", rank, v.shape)
        state.t = 10 * rank + i
    solver.set_states(states)
    return solver


def state_of(solver):
    return {name: (s.t, {k: v.d.copy() for k, v in s.pstate.items()})
            for name, s in solver.get_states().items()}


def same_state(got, expected):
    return got.keys() == expected.keys() and all(
        got[n][0] == expected[n][0] and got[n][1].keys() ==
        expected[n][1].keys() and all(same_bits(got[n][1][k], v)
                                      for k, v in expected[n][1].items())
        for n in expected)


def solver_states(ck, comm, groups):
    for name, ranks in groups:
        for kind in SOLVERS:
            root = len(ranks) - 1
            key = f"solver/{name}/{kind}"
            solver = solver_for(kind, key, comm.rank)
            nncomm.broadcast_solver_state(comm, solver, root, group=name)
            expected = solver_for(kind, key, ranks[root])
            ck.true(same_state(state_of(solver), state_of(expected)),
                    f"broadcast_solver_state {kind} on {name}{ranks} "
                    f"root={root}: pstate and t are world rank "
                    f"{ranks[root]}'s")
            nncomm.broadcast_parameters(comm, solver.get_parameters(), root,
                                        group=name)
            ck.true(same_bits(one_update(solver), one_update(expected)),
                    f"{kind} on {name}{ranks}: one update after both "
                    f"broadcasts gives world rank {ranks[root]}'s "
                    f"parameters")


def one_update(solver):
    """The parameters after one update with gradients the same on every
    rank, concatenated as bytes."""
    params = sorted(solver.get_parameters().items())
    for p, v in params:
        v.grad.cast(v.data.dtype)[...] = values(f"grad/{p}", 0, v.shape,
                                                v.data.dtype)
    solver.update()
    return np.frombuffer(b"".join(v.d.tobytes() for _, v in params),
                         np.uint8)


class Fragile:
    """Pickles everywhere; unpickles only on even world ranks."""

    def __getstate__(self):
        return {"fragile": True}  # an empty state would not be set

    def __setstate__(self, state):
        if MPI.COMM_WORLD.rank % 2:
            raise RuntimeError("odd ranks cannot unpickle Fragile")


def sample(kind, rank):
    """World rank `rank`'s object of `kind`."""
    if kind == "none":
        return None
    if kind == "scalars":
        return (rank, 2.5 * rank, "rank %d" % rank, True, b"\x00\xff")
    if kind == "nested":
        return {"rank": rank, "list": [1, [2, (3, {"deep": rank})]],
                "set": frozenset({rank, -1}), "empty": {}}
    if kind == "array":
        return values(f"object/{rank}", rank, (3, 5), np.float64)
    # Over 1 MiB, of a length of its own per rank (allgather pads).
    return bytes(np.random.default_rng(rank).integers(
        0, 256, (1 << 20) + 4099 * rank + 5, np.uint8))


KINDS = ("none", "scalars", "nested", "array", "large")


def same_object(got, expected):
    return pickle.dumps(got) == pickle.dumps(expected)


def objects(ck, comm, groups):
    for name, ranks in groups:
        me = ranks.index(comm.rank)
        for root, source in enumerate(ranks):
            for kind in KINDS:
                mine = sample(kind, comm.rank)
                got = nncomm.broadcast_object(comm, mine, root, group=name)
                ck.true(same_object(got, sample(kind, source)),
                        f"broadcast_object {kind} on {name}{ranks} "
                        f"root={root} gives world rank {source}'s",
                        repr(got)[:200])
                if me == root:
                    ck.true(got is mine, f"broadcast_object {kind} on "
                                         f"{name}: the root keeps obj itself")
        for kind in KINDS:
            mine = sample(kind, comm.rank)
            got = nncomm.allgather_object(comm, mine, group=name)
            ck.true(isinstance(got, list) and len(got) == len(ranks)
                    and all(same_object(g, sample(kind, r))
                            for g, r in zip(got, ranks)),
                    f"allgather_object {kind} on {name}{ranks}: entry i is "
                    f"world rank ranks[i]'s", repr(got)[:200])
            ck.true(got[me] is mine, f"allgather_object {kind} on {name}: "
                                     f"this rank's entry is obj itself")


def mismatches(comm, name, last):
    """Calls whose arguments differ on the group's last rank."""
    return [
        (ValueError, "different parameters",
         "broadcast_parameters with a name only the last rank has",
         lambda: nncomm.broadcast_parameters(
             comm, {"w" if not last else "v": variable(np.zeros(3))},
             group=name)),
        (ValueError, "different parameters",
         "broadcast_parameters with a shape only the last rank has",
         lambda: nncomm.broadcast_parameters(
             comm, [variable(np.zeros(3 + last))], group=name)),
        (ValueError, "different states",
         "broadcast_solver_state with Sgd on the last rank, else Adam",
         lambda: nncomm.broadcast_solver_state(
             comm, solver_for("Sgd" if last else "Adam", "mixed",
                              comm.rank), group=name)),
    ]


def errors(ck, comm, groups):
    for name, ranks in groups:
        k = len(ranks)
        last = comm.rank == ranks[-1]
        where = f"on {name}{ranks}"

        def healthy(what):
            got = nncomm.allgather_object(comm, ("ok", comm.rank),
                                          group=name)
            ck.equal(got, [("ok", r) for r in ranks],
                     f"allgather_object right after: {what}")

        cases = [
            (ValueError, "out of range", "broadcast_object root=k",
             lambda: nncomm.broadcast_object(comm, 1, k, group=name)),
            (ValueError, "out of range", "broadcast_parameters root=-1",
             lambda: nncomm.broadcast_parameters(
                 comm, model("bad", comm.rank), -1, group=name)),
            (ValueError, "out of range", "broadcast_solver_state root=k",
             lambda: nncomm.broadcast_solver_state(
                 comm, solver_for("Adam", "bad", comm.rank), k,
                 group=name)),
            (pickle.PicklingError, "cannot pickle",
             "broadcast_object of a lock on the last rank as root",
             lambda: nncomm.broadcast_object(
                 comm, threading.Lock() if last else 1, k - 1, group=name)),
            (pickle.PicklingError, f"group rank {k - 1}: ",
             "allgather_object of a lock on the last rank",
             lambda: nncomm.allgather_object(
                 comm, threading.Lock() if last else 1, group=name)),
        ]
        if k > 1:
            cases += mismatches(comm, name, last)
        refused = (TypeError, "params must be") if last else \
            (ValueError, "invalid arguments")
        cases.append(
            refused + ("broadcast_parameters of an int on the last rank",
                       lambda: nncomm.broadcast_parameters(
                           comm, 42 if last else {}, group=name)))
        if any(r % 2 for r in ranks[1:]):
            cases.append(
                (pickle.UnpicklingError, "cannot unpickle",
                 "broadcast_object of what odd ranks cannot unpickle",
                 lambda: nncomm.broadcast_object(comm, Fragile(), 0,
                                                 group=name)))
        if k > 1 and any(r % 2 for r in ranks):
            cases.append(
                (pickle.UnpicklingError, "cannot unpickle",
                 "allgather_object of what odd ranks cannot unpickle",
                 lambda: nncomm.allgather_object(comm, Fragile(),
                                                 group=name)))
        for exc, text, what, call in cases:
            ck.raises(exc, text, f"{what} {where}", call)
            healthy(f"{what} {where}")


def members(ck, comm):
    hosts = MPI.COMM_WORLD.allgather(MPI.Get_processor_name())
    expected = [nncomm.WorkerDescriptor(r, h) for r, h in enumerate(hosts)]
    ck.equal(comm.workers(), expected, "workers(): (world rank, host name)")
    ck.equal(comm.current_worker(), expected[comm.rank], "current_worker()")
    ck.equal(comm.current_worker().host_id, MPI.Get_processor_name(),
             "current_worker().host_id is this host's name")
    ck.equal(comm.is_main(), comm.rank == 0, "is_main() on world rank 0")
    for name in ("gpu", "nccl", "callback", "gradient_reducer"):
        ck.true(type(comm.is_capable(name)) is bool,
                f"is_capable({name!r}) is a bool")
    threads = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
    ck.equal(comm.is_capable("callback"), threads,
             "is_capable('callback') follows MPI's thread level")
    ck.raises(ValueError, "unknown capability", "is_capable('tpu')",
              comm.is_capable, "tpu")

    other, _ = make_comm()
    other.finalize()
    other.finalize()
    for what, use in (("rank", lambda: other.rank),
                      ("workers()", other.workers),
                      ("barrier()", other.barrier),
                      ("init()", other.init),
                      ("new_group", lambda: other.new_group(("g", [0]))),
                      ("broadcast_object",
                       lambda: nncomm.broadcast_object(other, 1))):
        ck.raises(RuntimeError, "finalized", f"{what} after finalize()", use)
    ck.true(not MPI.Is_finalized(), "finalize() leaves MPI initialized")
    ck.equal(nncomm.allgather_object(comm, comm.rank),
             list(range(comm.size)),
             "another communicator works after one is finalized")


def main():
    ck, comm, groups = start("objects")
    members(ck, comm)
    parameters(ck, comm, groups)
    solver_states(ck, comm, groups)
    objects(ck, comm, groups)
    errors(ck, comm, groups)
    ck.finish()


main()
