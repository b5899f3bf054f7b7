"""all_reduce_callback against all_reduce and against float64 references.

Every case runs the same graph twice on each rank with rank-dependent
inputs: a plain backward, whose local gradients are gathered from every
rank through mpi4py (independent of nncomm) and reduced with
`comm.all_reduce`, and a backward with the callback as function_post_hook
after zeroing the gradients. The callback's result must be the float64 sum
(mean with division) over the group's ranks of the gathered gradients times
scale_grad, within the rounding bound of `scaled_reference`, and equal to
all_reduce's result times scale_grad within twice that bound.

Covered: pack sizes from 1 element to far above the model, division x
scale_grad, clear_buffer; a weight used by four functions (reduced once,
after its last use: an earlier reduction would miss the other uses' terms);
parameters the graph does not reach or whose consumers do not need their
gradient (reduced with their current values at the end; still zeroing on
every rank: left zeroing); sub-groups with non-members not calling it;
two callbacks on different groups in one backward; float16 gradients with
keep_dtype False (reduced in float32, converted back: the bound is float32
rounding plus one float16 rounding) and True (reduced in float16: float16
rounding per addition); a callback reused over iterations and over a
rebuilt graph against a new one per iteration; gradients accumulated over
two backwards; nncomm.chain_hooks; priority order ("forward" and numbers).
"""
import numpy as np
from mpi4py import MPI

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
from nnabla.ext_utils import get_extension_context

import nncomm

from _harness import (Checker, contribution, make_comm, scaled_reference,
                      set_grad, standard_groups, world_gather,
                      zeroing_over_stale)

F16, F32 = np.float16, np.float32
BIG_PACK = 2 << 20  # nnabla-examples' pack size, far above every model here


class Model:
    """A loss, its input Variables and the parameters whose gradients are
    reduced, in the order of the callback's `data`."""

    def __init__(self, name, loss, inputs, params):
        self.name, self.loss, self.inputs = name, loss, inputs
        self.names = list(params)
        self.params = list(params.values())

    def feed(self, key, rank):
        for iname, v in self.inputs.items():
            v.d = contribution(f"{key}/{iname}", rank, v.shape, F32,
                               "rand") / 4

    def grads(self):
        return [p.grad for p in self.params]

    def zero_grads(self):
        for p in self.params:
            p.grad.zero()

    def local_backward(self):
        """A plain backward from zeroed gradients; every rank's resulting
        gradients (world_gather), and this rank's left in the arrays."""
        self.loss.forward()
        self.zero_grads()
        self.loss.backward()
        return world_gather(self.grads())

    def hooked_backward(self, hook, clear_buffer=False):
        self.loss.forward(clear_no_need_grad=clear_buffer)
        self.zero_grads()
        self.loss.backward(clear_buffer=clear_buffer, function_post_hook=hook)


def main_model():
    """Several shapes, odd sizes, a 0-d parameter and batch-norm (whose
    running statistics are not gradients): 1520 gradient elements."""
    np.random.seed(1)
    with nn.parameter_scope("main"):
        x, t = nn.Variable((3, 2, 5, 5)), nn.Variable((3, 3))
        h = PF.convolution(x, 4, (3, 3), pad=(1, 1), name="conv")  # 72 + 4
        h = F.relu(PF.batch_normalization(h, name="bn"))  # 4 + 4
        h = PF.affine(h, 13, name="fc1")  # 1300 + 13
        h = PF.prelu(h, name="prelu")  # a 0-d slope
        h = F.tanh(PF.affine(h, 7, name="fc2"))  # 91 + 7
        y = PF.affine(h, 3, name="fc3")  # 21 + 3
        loss = F.mean(F.squared_error(y, t))
        params = nn.get_parameters()
    return Model("main", loss, {"x": x, "t": t}, params)


def param(name, shape, seed):
    init = np.random.RandomState(seed).standard_normal(shape).astype(F32)
    return nn.parameter.get_parameter_or_create(name, shape, init / 2)


def shared_model():
    """W in three chained affines and a parallel branch, b in two: their
    gradients are final only after the last of these in backward order."""
    with nn.parameter_scope("shared"):
        x, x2, t = (nn.Variable((4, 6)), nn.Variable((4, 6)),
                    nn.Variable((4, 6)))
        W, b, V = param("W", (6, 6), 1), param("b", (6,), 2), \
            param("V", (6, 6), 3)
        h = F.tanh(F.affine(x, W, b))
        h = F.tanh(F.affine(h, W, b))
        h = F.affine(h, W) + F.affine(x2, V) + F.affine(x2, W)
        loss = F.sum(F.squared_error(h, t))
    return Model("shared", loss, {"x": x, "x2": x2, "t": t},
                 {"W": W, "b": b, "V": V})


def half_model():
    """Two affines in a float16 context (float16 gradients) and one in
    float32."""
    np.random.seed(2)
    half = get_extension_context("cpu", type_config="half")
    with nn.parameter_scope("half"):
        x, t = nn.Variable((4, 5)), nn.Variable((4, 3))
        with nn.context_scope(half):
            h = F.tanh(PF.affine(x, 7, name="h1"))
            h = PF.affine(h, 6, name="h2")
        y = PF.affine(F.tanh(h), 3, name="f1")
        loss = F.mean(F.squared_error(y, t))
        params = nn.get_parameters()
    return Model("half", loss, {"x": x, "t": t}, params)


def expect_reduced(ck, model, gathered, ranks, scale, division, what,
                   keep_dtype=False, indices=None, reduced=None):
    """Each gradient of `model` holds the reduction of `gathered`; with
    `reduced` (all_reduce's results, unscaled) also equals those times
    `scale`."""
    for i in (range(len(model.params)) if indices is None else indices):
        dt = gathered[0][i].dtype
        ref, tol = scaled_reference([gathered[r][i] for r in ranks], scale,
                                    division, dt if keep_dtype else F32, dt)
        name = f"{what} {model.name}/{model.names[i]}"
        ck.array(model.params[i].grad, ref, name, dt, tol)
        if reduced is not None:
            ck.array(model.params[i].grad,
                     reduced[i].astype(np.float64) * scale,
                     name + " == all_reduce * scale_grad", dt, 2 * tol)


def against_all_reduce(ck, comm, model, group, ranks, pack, division, scale,
                       clear_buffer, key, priority=None):
    """The callback's results against all_reduce's; returns the callback
    (on the group's ranks)."""
    model.feed(key, comm.rank)
    gathered = model.local_backward()  # every rank: world collective
    if comm.rank not in ranks:
        return
    comm.all_reduce(model.grads(), division=division, group=group)
    reduced = [np.array(g.data) for g in model.grads()]
    cb = comm.all_reduce_callback(model.grads(), pack, division=division,
                                  group=group, scale_grad=scale,
                                  priority=priority)
    model.hooked_backward(cb, clear_buffer)
    what = (f"callback group={group}{ranks} pack_size={pack} "
            f"division={division} scale_grad={scale} "
            f"clear_buffer={clear_buffer} priority={priority}")
    expect_reduced(ck, model, gathered, ranks, scale, division, what,
                   reduced=reduced)
    return cb


def prioritized(ck, comm, models, world):
    """priority: the results as without; the buckets launched alike on
    every rank, highest priority first: "forward" launches first the first
    layer's (the main model's convolution, gradients 0 and 1), numbers
    launch a higher before a lower, under every schedule."""
    main, shared = models
    for model, pack, priority in [
            (main, 8, "forward"), (main, 1000, "forward"),
            (shared, 2, "forward"),
            (main, 64, list(range(len(main.params)))[::-1])]:
        cb = against_all_reduce(ck, comm, model, "world", world, pack, True,
                                0.5, False, f"priority/{pack}", priority)
        what = f"{model.name} pack_size={pack} priority={priority}"
        everywhere = MPI.COMM_WORLD.allgather(cb.launch_order)
        ck.true(all(o == everywhere[0] for o in everywhere),
                f"{what}: launched alike on every rank", str(everywhere))
        if isinstance(priority, list):
            highest = [max(priority[i] for i in b) for b in cb.launch_order]
            ck.equal(highest, sorted(highest, reverse=True),
                     f"{what}: the highest priority first")
        elif model is main:
            ck.true({0, 1} & set(cb.launch_order[0]),
                    f"{what}: the first layer's gradients first",
                    str(cb.launch_order))


# -- gradients the graph does not produce -----------------------------------

class Frozen:
    """W1 trained; `mid` and `mid_written` used through need_grad=False
    Variables by functions whose backward runs (for their other input);
    `leaf` by a function whose backward is skipped entirely; `unused*` in no
    graph at all."""

    def __init__(self):
        with nn.parameter_scope("frozen"):
            self.x, self.t = nn.Variable((4, 5)), nn.Variable((4, 6))
            self.W1 = param("W1", (5, 6), 4)
            self.mid = param("mid", (6, 6), 5)
            self.mid_written = param("mid_written", (6, 6), 6)
            self.leaf = param("leaf", (5, 6), 7)
            self.unused = param("unused", (3, 4), 8)
            self.unused_zeroing = param("unused_zeroing", (7,), 9)
            self.unused_some = param("unused_some", (2, 3), 10)
            h = F.tanh(F.affine(self.x, self.W1))
            h = F.affine(h, self.mid.get_unlinked_variable(need_grad=False))
            h = F.affine(h, self.mid_written.get_unlinked_variable(
                need_grad=False))
            c = F.affine(self.x, self.leaf.get_unlinked_variable(
                need_grad=False))
            self.loss = F.sum(F.squared_error(h + c, self.t))

    def case(self, ck, comm, group, ranks, pack, division, scale, key,
             graph_params=True):
        rank = comm.rank
        for name, v in (("x", self.x), ("t", self.t)):
            v.d = contribution(f"{key}/{name}", rank, v.shape, F32,
                               "rand") / 4
        self.loss.forward()
        self.W1.grad.zero()
        self.loss.backward()
        gathered = world_gather([self.W1.grad])
        if rank not in ranks:
            return

        def values(name, r, shape):
            return contribution(f"{key}/{name}", r, shape, F32, "rand")

        # What each rank holds when the callback starts; zeroing arrays
        # over stale memory.
        written = {"unused": set(ranks), "mid_written": set(ranks),
                   "unused_some": {ranks[0]}}
        zeroing = ["unused_zeroing", "mid", "leaf"]
        for name, writers in written.items():
            v = getattr(self, name)
            if rank in writers:
                set_grad(v.grad, values(name, rank, v.shape))
            else:
                zeroing_over_stale(v.grad, values(name + "/stale", rank,
                                                  v.shape) + 50)
        for name in zeroing:
            v = getattr(self, name)
            zeroing_over_stale(v.grad,
                               values(name + "/stale", rank, v.shape) + 50)
        order = ["unused", "W1", "mid", "unused_zeroing", "leaf",
                 "mid_written", "unused_some"]
        if not graph_params:
            order = ["unused", "unused_zeroing", "unused_some"]
        cb = comm.all_reduce_callback([getattr(self, n).grad for n in order],
                                      pack, division=division, group=group,
                                      scale_grad=scale)
        self.loss.forward()
        self.W1.grad.zero()
        self.loss.backward(function_post_hook=cb)
        what = (f"callback group={group}{ranks} pack_size={pack} "
                f"division={division} scale_grad={scale} data={order}")
        for name in order:
            v = getattr(self, name)
            if name == "W1":
                ref, tol = scaled_reference([gathered[r][0] for r in ranks],
                                            scale, division)
                ck.array(v.grad, ref, f"{what}: W1", F32, tol)
            elif name in written:
                ref, tol = scaled_reference(
                    [values(name, r, v.shape) if r in written[name]
                     else np.zeros(v.shape, F32) for r in ranks],
                    scale, division)
                # The flag first: reading the values would clear it.
                ck.true(not v.grad.zeroing,
                        f"{what}: {name} (written by "
                        f"{sorted(written[name])}) no longer zeroing")
                ck.array(v.grad, ref, f"{what}: {name} written by "
                         f"{sorted(written[name])}, reduced with its "
                         f"current values", F32, tol)
            else:
                ck.true(v.grad.zeroing, f"{what}: {name}, zeroing on every "
                        f"rank, still zeroing")
                ck.array(v.grad, np.zeros(v.shape, F32),
                         f"{what}: {name} reads as zeros", F32)


# -- several callbacks, float16, reuse, chain_hooks -------------------------

def two_groups(ck, comm, model, sub, sub_ranks, key):
    """One backward, the first half of the gradients on a world callback and
    the rest on a sub-group callback (members only); non-members keep their
    local gradients there."""
    model.feed(key, comm.rank)
    gathered = model.local_backward()
    half = len(model.params) // 2
    grads = model.grads()
    hooks = [comm.all_reduce_callback(grads[:half], 8, division=True,
                                      scale_grad=0.5)]
    member = comm.rank in sub_ranks
    if member:
        hooks.append(comm.all_reduce_callback(grads[half:], 1000,
                                              group=sub))
    model.hooked_backward(nncomm.chain_hooks(*hooks))
    world = list(range(comm.size))
    what = f"two callbacks: world pack 8 mean x0.5 + {sub}{sub_ranks} sum"
    expect_reduced(ck, model, gathered, world, 0.5, True, what,
                   indices=range(half))
    if member:
        expect_reduced(ck, model, gathered, sub_ranks, 1, False, what,
                       indices=range(half, len(model.params)))
    else:
        for i in range(half, len(model.params)):
            ck.array(model.params[i].grad, gathered[comm.rank][i],
                     f"{what}: {model.names[i]} untouched on non-member "
                     f"rank {comm.rank}", F32)


def float16_cases(ck, comm, model, group, ranks, key):
    model.feed(key + "/premise", comm.rank)
    gathered = model.local_backward()
    dtypes = {n: g.dtype for n, g in zip(model.names, gathered[comm.rank])}
    ck.true(dtypes["h1/affine/W"] == F16 and dtypes["f1/affine/W"] == F32,
            "premise: the half model has float16 and float32 gradients",
            str(dtypes))
    for keep_dtype in (False, True):
        for division in (False, True):
            for scale, pack in ((1, 8), (0.125, BIG_PACK)):
                k = f"{key}/{keep_dtype}/{division}/{scale}"
                model.feed(k, comm.rank)
                gathered = model.local_backward()
                if comm.rank not in ranks:
                    continue
                cb = comm.all_reduce_callback(
                    model.grads(), pack, division=division, group=group,
                    scale_grad=scale, keep_dtype=keep_dtype)
                model.hooked_backward(cb)
                expect_reduced(ck, model, gathered, ranks, scale, division,
                               f"float16 callback group={group}{ranks} "
                               f"keep_dtype={keep_dtype} pack_size={pack} "
                               f"division={division} scale_grad={scale}",
                               keep_dtype=keep_dtype)


def reuse(ck, comm, key):
    """One callback created before the loop, against a new one per
    iteration, over a static graph and over a graph rebuilt per iteration
    on the same parameters."""
    world = list(range(comm.size))
    model = main_model()
    once = comm.all_reduce_callback(model.grads(), 100, division=True,
                                    scale_grad=0.5)
    for it in range(4):
        if it >= 2:
            model = main_model()  # a new graph over the same parameters
        model.feed(f"{key}/{it}", comm.rank)
        gathered = model.local_backward()
        what = f"iteration {it} ({'rebuilt' if it >= 2 else 'static'} graph)"
        model.hooked_backward(once, clear_buffer=bool(it % 2))
        expect_reduced(ck, model, gathered, world, 0.5, True,
                       what + ", callback created once")
        model.hooked_backward(comm.all_reduce_callback(
            model.grads(), 100, division=True, scale_grad=0.5))
        expect_reduced(ck, model, gathered, world, 0.5, True,
                       what + ", new callback")


def accumulated(ck, comm, model, key):
    """Gradient accumulation: two micro-batches, the callback only on the
    second backward; the gradients reduced are the accumulated ones."""
    world = list(range(comm.size))

    def two_backwards(hook):
        model.feed(f"{key}/1", comm.rank)
        model.loss.forward()
        model.zero_grads()
        model.loss.backward()
        model.feed(f"{key}/2", comm.rank)
        model.loss.forward()
        model.loss.backward(function_post_hook=hook)

    two_backwards(None)
    gathered = world_gather(model.grads())
    two_backwards(comm.all_reduce_callback(model.grads(), 64,
                                           scale_grad=0.5))
    expect_reduced(ck, model, gathered, world, 0.5, False,
                   "accumulated over two backwards, callback on the second")


def chained(ck, comm, model, key):
    world = list(range(comm.size))
    model.feed(key, comm.rank)
    gathered = model.local_backward()
    plain = []
    model.hooked_backward(lambda f: plain.append(f.name))
    ck.true(len(plain) >= 10, "premise: the user hook runs per function",
            str(plain))

    # chain_hooks(user, callback, user2): each hook once per function, in
    # that order; the first user hook sees fc3's gradient before the
    # callback was called for its last consumer, so still local.
    fc3 = model.names.index("fc3/affine/W")
    fc3_hash = hash(model.params[fc3])
    log, seen = [], []

    def first(f):
        log.append(("first", f.name))
        if any(hash(v) == fc3_hash for v in f.inputs):
            seen.append(np.array(model.params[fc3].grad.data))

    cb = comm.all_reduce_callback(model.grads(), 8, scale_grad=0.5)
    model.hooked_backward(nncomm.chain_hooks(
        first, cb, lambda f: log.append(("second", f.name))))
    expected = [(w, n) for n in plain for w in ("first", "second")]
    ck.true(log == expected, "chain_hooks(first, callback, second) calls "
            "each hook once per function, in order",
            f"got {log[:8]}..., expected {expected[:8]}...")
    ck.true(len(seen) == 1 and np.array_equal(seen[0],
                                              gathered[comm.rank][fc3]),
            "chain_hooks: the hook before the callback sees fc3/W's local "
            "gradient")
    expect_reduced(ck, model, gathered, world, 0.5, False,
                   "chain_hooks(first, callback, second)")

    count = []
    cb = comm.all_reduce_callback(model.grads(), BIG_PACK, division=True)
    model.hooked_backward(nncomm.chain_hooks(cb, lambda f: count.append(1)))
    ck.equal(len(count), len(plain),
             "chain_hooks(callback, user): user hook calls")
    expect_reduced(ck, model, gathered, world, 1, True,
                   "chain_hooks(callback, user)")


def main():
    ck = Checker("callback")
    comm, _ = make_comm()
    groups = standard_groups(comm, ck)
    n = comm.size
    model, shared, frozen = main_model(), shared_model(), Frozen()
    ck.equal(sum(p.size for p in model.params), 1520,
             "premise: the main model's gradient elements")
    packs = [1, 2, 8, 1000, 1521, BIG_PACK]
    step = 0
    for group, ranks in groups.items():
        world = group == "world"
        for pack in (packs if world else [8, BIG_PACK]):
            for division in (False, True):
                for scale in ((1, 0.5) if world else (0.5,)):
                    step += 1
                    against_all_reduce(ck, comm, model, group, ranks, pack,
                                       division, scale, step % 2 == 0,
                                       f"main/{step}")
        for pack in ((1, 2, 8, 1000, BIG_PACK) if world else (2,)):
            for division, scale in ((False, 1), (True, 0.5)):
                step += 1
                against_all_reduce(ck, comm, shared, group, ranks, pack,
                                   division, scale, False, f"shared/{step}")
        for pack in ((1, 8, BIG_PACK) if world else (8,)):
            for division, scale in ((False, 1), (True, 0.5)):
                step += 1
                frozen.case(ck, comm, group, ranks, pack, division, scale,
                            f"frozen/{step}")
        step += 1
        frozen.case(ck, comm, group, ranks, 4, True, 0.5, f"frozen/{step}",
                    graph_params=False)
    for sub in [g for g in groups if g != "world"]:
        two_groups(ck, comm, model, sub, groups[sub], f"two/{sub}")
    half = half_model()
    for group in ("world", "reversed" if n >= 2 else "single_last"):
        float16_cases(ck, comm, half, group, groups[group], f"half/{group}")
    prioritized(ck, comm, (model, shared), groups["world"])
    reuse(ck, comm, "reuse")
    accumulated(ck, comm, model, "accumulated")
    chained(ck, comm, model, "chained")
    ck.finish()


main()
