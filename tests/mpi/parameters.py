"""add_context_and_parameters / allreduce / clear_context_parameters.

The deprecated allreduce(division, inplace) must reduce exactly the
gradients registered so far: not the data, not unregistered Variables, and
nothing from a registration that raised.
"""
import numpy as np

import nnabla as nn

from _harness import Checker, contribution, make_comm, nd, reference

SHAPES = {"w": ((3, 4), np.float32), "b": ((5,), np.float16),
          "c": ((2, 2, 2), np.float64), "d": ((7,), np.float32),
          "big": ((300007,), np.float32), "free": ((3,), np.float32)}


def variables():
    out = {}
    for name, (shape, _) in SHAPES.items():
        v = nn.Variable(shape, need_grad=True)
        out[name] = v
    return out


def fill(vs, comm, key):
    """Gives every Variable rank-dependent data and grads; returns them."""
    values = {}
    for name, v in vs.items():
        shape, dt = SHAPES[name]
        data = contribution(f"{key}/{name}/data", comm.rank, shape, np.float32)
        grad = contribution(f"{key}/{name}/grad", comm.rank, shape, dt)
        v.data = nd(data)
        v.grad = nd(grad)
        values[name] = (data, grad)
    return values


def check(ck, comm, vs, values, reduced, division, key, what):
    for name, v in vs.items():
        shape, dt = SHAPES[name]
        data, grad = values[name]
        label = f"{what}: {name}"
        ck.array(v.data, data, f"{label}.data unchanged", np.float32)
        if name in reduced:
            ref, tol = reference(
                [contribution(f"{key}/{name}/grad", r, shape, dt)
                 for r in range(comm.size)], dt, division)
            ck.array(v.grad, ref, f"{label}.grad reduced", dt, tol)
        else:
            ck.array(v.grad, grad, f"{label}.grad unchanged", dt)


def main():
    ck = Checker("parameters")
    comm, ctx = make_comm()
    vs = variables()
    comm.add_context_and_parameters((ctx, {"w": vs["w"], "b": vs["b"]}))
    comm.add_context_and_parameters((ctx, {"c": vs["c"],
                                           "big": vs["big"]}))
    registered = {"w", "b", "c", "big"}
    step = 0

    def round_trip(what, registered, division=False, inplace=False,
                   positional=False):
        nonlocal step
        step += 1
        key = f"step{step}"
        values = fill(vs, comm, key)
        if positional:
            comm.allreduce(division, inplace)
        else:
            comm.allreduce(division=division, inplace=inplace)
        check(ck, comm, vs, values, registered, division, key,
              f"{what} division={division} inplace={inplace}")

    for division in (False, True):
        for inplace in (False, True):
            round_trip("allreduce", registered, division, inplace)
    round_trip("allreduce(True, False) positional", registered, True, False,
               positional=True)
    round_trip("allreduce() defaults (sum)", registered)

    # Frozen parameters: a grad zeroed on every rank is skipped and stays
    # zeroing; one zeroed on some ranks only is reduced with their zeros.
    step += 1
    key = f"step{step}"
    values = fill(vs, comm, key)
    vs["b"].grad.zero()
    if comm.rank != 0:
        vs["w"].grad.zero()
    comm.allreduce(division=False, inplace=False)
    ck.true(vs["b"].grad.zeroing, "allreduce: grad zeroed everywhere stays "
                                  "zeroing")
    ck.array(vs["b"].grad, np.zeros(SHAPES["b"][0], SHAPES["b"][1]),
             "allreduce: grad zeroed everywhere reads zeros")
    ck.true(not vs["w"].grad.zeroing, "allreduce: grad written on rank 0 "
                                      "is no longer zeroing")
    ck.array(vs["w"].grad, values["w"][1] if comm.rank == 0 else
             contribution(f"{key}/w/grad", 0, *SHAPES["w"]),
             "allreduce: grad written on rank 0 only holds rank 0's values")
    for name in ("c", "big"):
        ref, _ = reference([contribution(f"{key}/{name}/grad", r,
                                         *SHAPES[name])
                            for r in range(comm.size)], SHAPES[name][1])
        ck.array(vs[name].grad, ref, f"allreduce beside zeroing grads: "
                                     f"{name}", SHAPES[name][1])

    # Malformed registrations raise and register nothing.
    w, d = vs["w"], vs["d"]
    bad = [
        ("a dict, not a tuple", TypeError, "tuple", {"d": d}),
        ("a list", TypeError, "tuple", [ctx, {"d": d}]),
        ("a 1-tuple", TypeError, "tuple", (ctx,)),
        ("a 3-tuple", TypeError, "tuple", (ctx, {"d": d}, None)),
        ("None", TypeError, "tuple", None),
        ("a list of Variables", TypeError, "dict", (ctx, [d])),
        ("an NdArray value", TypeError, "Variable",
         (ctx, {"d": d, "x": nd(np.ones(3, np.float32))})),
        ("w again", ValueError, "already added", (ctx, {"w2": w})),
        ("d and w again", ValueError, "already added",
         (ctx, {"d": d, "w_again": w})),
        ("d twice in one dict", ValueError, "already added",
         (ctx, {"d": d, "d2": d})),
    ]
    for what, exc, text, arg in bad:
        ck.raises(exc, text, f"add_context_and_parameters({what})",
                  comm.add_context_and_parameters, arg)
    round_trip("after failed registrations", registered, True, False)

    # The same Variable may come back after clearing.
    comm.clear_context_parameters()
    round_trip("after clear_context_parameters", set(), True, True)
    comm.add_context_and_parameters((ctx, {"d": d, "w": w}))
    round_trip("re-added after clear", {"d", "w"}, False, False)
    comm.add_context_and_parameters((ctx, {}))
    round_trip("after adding an empty dict", {"d", "w"}, True, True)
    comm.clear_context_parameters()
    round_trip("cleared again", set())
    ck.finish()


main()
