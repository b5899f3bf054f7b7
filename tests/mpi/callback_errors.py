"""Bad arguments to all_reduce_callback raise a clear Python exception on
every rank that passed them, change nothing, and leave the communicator
working; ranks whose gradients differ (in sizes or priorities), from the
first backward or from a later one, all raise instead of waiting.

After every error a correct world all_reduce and a correct callback-driven
backward run: had any rank entered a collective for the bad call, they
would be matched against the wrong call, and the job would hang (killed by
the test's timeout) or abort.

Usage: callback_errors.py [ROUTE]: backward takes the callback as
function_post_hook ("hook", the default) or in communicator_callbacks
("callbacks").
"""
import sys

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF

import nncomm
import nncomm.communicators as C

from _harness import (Checker, ErrorChecks, contribution, exception_chain,
                      make_comm, nd, reference, scaled_reference,
                      standard_groups, world_gather)


ROUTE = sys.argv[1] if len(sys.argv) > 1 else "hook"


def backward(loss, cb):
    if ROUTE == "callbacks":
        loss.backward(communicator_callbacks=cb)
    else:
        loss.backward(function_post_hook=cb)


class Errors(ErrorChecks):
    def __init__(self, ck, comm, ctx):
        self.ck, self.comm, self.ctx = ck, comm, ctx
        self.step = 0
        np.random.seed(3)
        with nn.parameter_scope("errors"):
            self.x = nn.Variable((2, 5))
            y = PF.affine(F.tanh(PF.affine(self.x, 4, name="a")), 3,
                          name="b")
            self.loss = F.sum(y * y)
            self.params = list(nn.get_parameters().values())

    def grads(self):
        return [p.grad for p in self.params]

    def healthy(self, what):
        """A correct world all_reduce and a correct callback right after
        the error."""
        self.step += 1
        key = f"healthy/{self.step}"
        comm, world = self.comm, list(range(self.comm.size))
        x = nd(contribution(key, comm.rank, (5,), np.int32))
        comm.all_reduce(x)
        ref, _ = reference([contribution(key, r, (5,), np.int32)
                            for r in world], np.int32)
        self.ck.array(x, ref, f"all_reduce right after: {what}", np.int32)

        self.x.d = contribution(key + "/x", comm.rank, self.x.shape,
                                np.float32, "rand")
        self.loss.forward()
        for p in self.params:
            p.grad.zero()
        self.loss.backward()
        gathered = world_gather(self.grads())
        cb = comm.all_reduce_callback(self.grads(), 7, division=True)
        self.loss.forward()
        for p in self.params:
            p.grad.zero()
        backward(self.loss, cb)
        for i, p in enumerate(self.params):
            ref, tol = scaled_reference([gathered[r][i] for r in world],
                                        1, True)
            self.ck.array(p.grad, ref, f"callback right after: {what} [{i}]",
                          np.float32, tol)



def bad_data(e):
    comm, grads = e.comm, e.grads()
    cb = comm.all_reduce_callback
    for what, data, text in [
            ("an int", 5, "data"),
            ("a str", "grads", "data"),
            ("None", None, "data"),
            ("a numpy array in the list", [grads[0], np.zeros(3, np.float32)],
             "ndarray"),
            ("a Variable in the list", [grads[0], e.params[1]], "variable"),
            ("None in the list", [grads[0], None], "nonetype"),
            ("a nested list", [grads[:1], grads[1:]], "list")]:
        e.expect(TypeError, text, f"all_reduce_callback with data {what}",
                 cb, data, 8, untouched=grads)
    # One gradient twice would be reduced twice.
    e.expect(ValueError, "same array", "all_reduce_callback with one "
             "gradient twice (two wrappers of p.grad)", cb,
             [grads[0], grads[1], e.params[0].grad], 8, untouched=grads)
    # Not a floating-point gradient.
    ints = nd(np.arange(3, dtype=np.int32))
    ints.cast(np.uint8)
    e.expect(TypeError, "uint8", "all_reduce_callback with a uint8 array",
             cb, [grads[0], ints], 8, untouched=grads)


def bad_pack_size(e):
    comm, grads = e.comm, e.grads()
    for pack in (0, -1, -(2 << 20)):
        e.expect(ValueError, "pack_size", f"all_reduce_callback with "
                 f"pack_size={pack}", comm.all_reduce_callback, grads, pack,
                 untouched=grads)
    e.expect(TypeError, "", "all_reduce_callback with pack_size='8'",
             comm.all_reduce_callback, grads, "8", untouched=grads)


def bad_group(e, groups):
    comm, grads = e.comm, e.grads()
    e.expect(ValueError, "nosuchgroup", "all_reduce_callback on an unknown "
             "group", comm.all_reduce_callback, grads, 8, group="nosuchgroup",
             untouched=grads)
    for name, ranks in groups.items():
        if comm.rank not in ranks:
            e.ck.raises(ValueError, "not included", f"all_reduce_callback on "
                        f"group {name}{ranks} from non-member rank "
                        f"{comm.rank}", comm.all_reduce_callback, grads, 8,
                        group=name)
    # Members made no call, so the check is done alone; then all ranks
    # meet again.
    e.healthy("non-member calls")


def two_layers(scope):
    """The weights W (5 x 4) and V (4 x 2) of a small net, in `scope`."""
    with nn.parameter_scope(scope):
        return [nn.parameter.get_parameter_or_create(
            name, shape, np.full(shape, 0.1, np.float32))
            for name, shape in (("W", (5, 4)), ("V", (4, 2)))]


def expect_disagreement(e, what, loss, cb):
    """Backward with `cb` raises on every rank, saying the ranks disagree
    on the gradients; then the communicator works."""
    e.ck.count += 1
    try:
        backward(loss, cb)
        e.ck.fail(what, "did not raise")
    except Exception as exc:
        chain = exception_chain(exc)
        if "disagree on the gradients" not in chain:
            e.ck.fail(what, f"the exception does not say ranks differ: "
                            f"{chain}")
    e.healthy(what)


def gradients_differ(e):
    """Rank 0 lists the gradients in another order than the other ranks:
    their sizes differ, which no plan over what the ranks' backwards
    reach can reconcile (nnabla's callback mixes the data)."""
    comm = e.comm
    W, V = two_layers("differ")
    loss = F.sum(F.affine(F.tanh(F.affine(e.x, W)), V))
    e.x.d = contribution("differ", comm.rank, e.x.shape, np.float32, "rand")
    loss.forward()
    W.grad.zero()
    V.grad.zero()
    grads = [V.grad, W.grad] if comm.rank == 0 else [W.grad, V.grad]
    expect_disagreement(e, "backward over gradients listed in another "
                        "order on rank 0", loss,
                        comm.all_reduce_callback(grads, 4))


def priorities_change_on_one_rank(e):
    """The ranks agree in the first backward, whose plan each rank keeps;
    in the second, rank 0's callback orders the buckets by other
    priorities and plans anew while the others reuse their plan."""
    comm = e.comm
    W, V = two_layers("priorities")
    loss = F.sum(F.affine(F.tanh(F.affine(e.x, W)), V))
    for step in range(2):
        e.x.d = contribution(f"priorities/{step}", comm.rank, e.x.shape,
                             np.float32, "rand")
        loss.forward()
        W.grad.zero()
        V.grad.zero()
        priority = (1.0, 0.0) if step == 1 and comm.rank == 0 else None
        cb = comm.all_reduce_callback([W.grad, V.grad], 4, priority=priority)
        if step == 0:
            backward(loss, cb)
        else:
            expect_disagreement(e, "backward whose priorities changed on "
                                "rank 0", loss, cb)


def before_init(e):
    comm = C.MultiProcessDataParallelCommunicator(e.ctx)
    e.expect(RuntimeError, "init", "all_reduce_callback before init()",
             comm.all_reduce_callback, e.grads(), 8, untouched=e.grads())


def chain_hooks_errors(e):
    e.ck.raises(TypeError, "callable", "chain_hooks of a non-callable",
                nncomm.chain_hooks, print, 5)


def main():
    ck = Checker("callback_errors")
    comm, ctx = make_comm()
    groups = standard_groups(comm, ck)
    e = Errors(ck, comm, ctx)
    e.healthy("nothing: the first backward")
    bad_data(e)
    bad_pack_size(e)
    bad_group(e, groups)
    if comm.size > 1:
        gradients_differ(e)
        priorities_change_on_one_rank(e)
    before_init(e)
    chain_hooks_errors(e)
    ck.finish()


main()
