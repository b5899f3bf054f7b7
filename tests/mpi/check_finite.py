"""The NaN/infinity check (check_finite): a NaN or an infinity written into
one rank's gradient of a named parameter during backward makes every rank
raise NonFiniteGradientError at the end of the reduction, naming that rank
and parameter, before any update; parameters stay as they were on every
rank, and the next clean step reduces to the numpy mean of the ranks'
gradients. With every gradient finite, the check changes no bit.

Usage: check_finite.py ROUTE, ROUTE being how the gradients are reduced:
hook (all_reduce_callback as function_post_hook, with a gradient the graph
does not reach), callbacks (nnabla's communicator_callbacks=), solver
(DistributedSolver), quantized (DistributedSolver with 8-bit quantized
compression: the next step to quantization's precision) or reducer
(gradient_reducer after a plain backward).
With NNCOMM_CHECK_FINITE=1 in the environment, the check is left to the
setting (check_finite=None) instead of passed. Run with pack_size 16 (so
that gradients are split across buckets) and with NNCOMM_DIRECT_BYTES=64
(weights reduced where they lie).
"""
import os
import sys

import numpy as np

import nnabla as nn
import nnabla.solvers as S

import nncomm
from nncomm import NonFiniteGradientError

from _harness import Checker, make_comm, three_layer_mlp, world_gather

ROUTE = sys.argv[1]
PACK = 16
BY_SETTING = os.environ.get("NNCOMM_CHECK_FINITE") == "1"


def main():
    ck = Checker("check_finite")
    comm, _ = make_comm()
    x, t, loss, names, variables = three_layer_mlp(11)
    params = dict(zip(names, variables))
    unused = None
    if ROUTE == "hook":
        # In the callback's list, but not in the graph: reduced at the end.
        unused = nn.Variable((5,), need_grad=True)
        unused.d = 0
    grads = [p.grad for p in variables] + \
        ([unused.grad] if unused is not None else [])
    check = None if BY_SETTING else True
    sgd = S.Sgd(0.1)
    sgd.set_parameters(params)
    solver = None
    if ROUTE in ("solver", "quantized"):
        compression = nncomm.Compression.quantized(8, error_feedback=False) \
            if ROUTE == "quantized" else nncomm.Compression.none
        solver = nncomm.DistributedSolver(S.Sgd(0.1), comm, pack_size=PACK,
                                          check_finite=check,
                                          compression=compression)
        solver.set_parameters(params)
    elif ROUTE == "reducer":
        reducer = comm.gradient_reducer(grads, PACK, division=True,
                                        check_finite=check)
        unchecked = comm.gradient_reducer(grads, PACK, division=True,
                                          check_finite=False)
    else:
        cb = comm.all_reduce_callback(grads, PACK, division=True,
                                      check_finite=check)
        unchecked = comm.all_reduce_callback(grads, PACK, division=True,
                                             check_finite=False)

    def inject(bad):
        """A hook writing bad[rank] = (name, value) into that parameter's
        gradient once the function that computes it has run."""
        if comm.rank not in bad or bad[comm.rank][0] not in params:
            return None
        name, value = bad[comm.rank]
        target = hash(params[name])

        def hook(f):
            if any(hash(v) == target for v in f.inputs):
                params[name].g.flat[0] = value
        return hook

    def forward(it, bad):
        """Step `it`'s forward, gradients zeroed (the unused one set)."""
        rng = np.random.default_rng(1000 * it + comm.rank)
        x.d = rng.standard_normal(x.shape)
        t.d = rng.standard_normal(t.shape)
        loss.forward()
        for g in grads:
            g.zero()
        if unused is not None:
            unused.g = np.nan if bad.get(comm.rank, ("",))[0] == "unused" \
                else comm.rank + 1.0

    def step(bad, checked=True, it=0):
        forward(it, bad)
        hook = inject(bad)
        if solver is not None:
            solver.zero_grad()
            solver.backward(loss, function_post_hook=hook)
        elif ROUTE == "reducer":
            loss.backward(function_post_hook=hook)
            r = reducer if checked else unchecked
            r.begin()
            for i in reversed(range(len(grads))):
                r.ready(i)
            r.finish()
        elif ROUTE == "callbacks":
            loss.backward(function_post_hook=hook,
                          communicator_callbacks=cb if checked else unchecked)
        else:
            # nnabla turns an exception in a hook into a SystemError; the
            # callback's is its cause.
            try:
                loss.backward(function_post_hook=nncomm.chain_hooks(
                    hook, cb if checked else unchecked))
            except SystemError as e:
                cause = e.__cause__
                if not isinstance(cause, NonFiniteGradientError):
                    raise
                raise cause

    def update():
        (solver or sgd).update()

    def reference(it):
        """The numpy mean over the ranks of each rank's own gradients."""
        forward(it, {})
        loss.backward()
        every = world_gather(grads)
        return [np.sum([every[r][i] for r in range(comm.size)], axis=0,
                       dtype=np.float32) / np.float32(comm.size)
                for i in range(len(grads))]

    cases = [{r: (name, value)}
             for r in sorted({0, comm.size - 1})
             for name, value in (("b/affine/W", np.nan),
                                 ("c/affine/b", np.inf),
                                 ("a/affine/W", -np.inf))]
    if unused is not None:
        cases.append({comm.size - 1: ("unused", np.nan)})
    if comm.size > 1:
        cases.append({0: ("a/affine/b", np.nan), 1: ("c/affine/W", np.inf)})
    it = 0
    for bad in cases:
        what = f"{ROUTE}, {bad}"
        before = {n: np.array(p.d) for n, p in params.items()}
        try:
            step(bad, it=it)
            update()
            ck.fail(f"{what}: no rank raised")
        except NonFiniteGradientError as e:
            ck.equal(e.ranks, tuple(sorted(bad)), f"{what}: ranks")
            for r, (name, _) in bad.items():
                shown = e.parameters.get(r, ())
                ck.true(len(shown) == 1 and (
                    shown[0].startswith(repr(name)) if name != "unused"
                    else shown[0].startswith(f"data[{len(grads) - 1}]")),
                        f"{what}: rank {r}'s parameter named", str(e))
                ck.true(f"rank {r}: " in str(e), f"{what}: message", str(e))
            ck.true(isinstance(e, ArithmeticError), f"{what}: arithmetic")
        if solver is not None:
            ck.raises(RuntimeError, "not all-reduced",
                      f"{what}: DistributedSolver refuses to update", update)
        for n, p in params.items():
            ck.array(p.data, before[n], f"{what}: {n} unchanged")
        it += 1
        # The loop goes on: a clean step reduces to the numpy mean.
        expected = reference(it)
        step({}, it=it)
        for i, (g, want) in enumerate(zip(grads, expected)):
            # 8-bit levels: within a 255th of each rank's range per rank.
            tol = 0.02 * np.abs(want).max() + 1e-6 \
                if ROUTE == "quantized" else 1e-6 * (1 + np.abs(want))
            ck.array(g, want, f"{what}: next step, gradient {i}", np.float32,
                     tol=tol)
        update()
        it += 1
    if solver is None:
        # With every gradient finite, checking changes no bit.
        got = {}
        for checked in (True, False):
            step({}, checked, it=it)
            got[checked] = [np.array(g.data) for g in grads]
        for i, (a, b) in enumerate(zip(got[True], got[False])):
            ck.true(a.tobytes() == b.tobytes(),
                    f"{ROUTE}: gradient {i} the same with the check on")
    if BY_SETTING:
        ck.true(os.environ.get("NNCOMM_CHECK_FINITE") == "1", "by setting")
    ck.finish()


main()
