"""A backward that does not run to its end never leaves gradients partly
all-reduced without an exception, on any rank, and never makes two
iterations' buckets meet.

- A backward stopped part-way by an exception nncomm does not see (a user
  hook chained with a lambda), on every rank or on one, with a new callback
  each step (nnabla-examples' pattern) or one reused: the others raise
  "another rank ... failed" instead of waiting, and the next backward, the
  same loop on every rank, is correct, with a RuntimeWarning on the ranks
  where it stopped (raising there would skip their next backward alone,
  pairing the ranks' iterations one apart from then on).
- The same stop seen by nncomm (nncomm.chain_hooks): the backward is closed
  at once, every other rank raises, and the next backward is correct.
- Two callbacks over the same gradients, or over overlapping ones, chained
  in one backward: every rank raises; the next backward is correct.
- A graph analysis that predicts a function backward never calls (injected
  here): the solver step reduces what is left before it reads the
  gradients (with a warning), on every rank; without a solver, the next
  backward warns and is correct.
- An analysis that misses a function backward calls (injected): that call
  raises on every rank.
- Engines kept within their memory bound, per group, so that no rank drops
  an engine its group's other ranks keep.
"""
import os
import warnings

import numpy as np

import nnabla.solvers as S

import nncomm
import nncomm._nncomm as core

from _harness import (Checker, contribution, exception_chain, make_comm,
                      scaled_reference, three_layer_mlp, world_gather)


class Stop(Exception):
    pass


class Steps:
    def __init__(self, ck, comm):
        self.ck, self.comm = ck, comm
        self.world = list(range(comm.size))
        self.x, self.t, self.loss, self.names, self.params = \
            three_layer_mlp(31)
        self.grads = [p.grad for p in self.params]
        self.count = 0

    def backward(self, hook=None, same_data=False):
        """forward and backward on new rank-dependent data (the previous
        step's with `same_data`)."""
        self.count += 0 if same_data else 1
        key = f"lifecycle/{self.count}"
        rank = self.comm.rank
        self.x.d = contribution(key + "/x", rank, self.x.shape, np.float32,
                                "rand")
        self.t.d = contribution(key + "/t", rank, self.t.shape, np.float32,
                                "rand")
        self.loss.forward()
        for p in self.params:
            p.grad.zero()
        self.loss.backward(function_post_hook=hook)

    def raises(self, what, fn, *texts):
        """`fn()` raises with one of `texts` in its exception chain."""
        self.ck.count += 1
        try:
            fn()
        except Exception as e:
            chain = exception_chain(e)
            if not any(t in chain for t in texts):
                self.ck.fail(what, f"raised, but not with {texts}: {chain}")
            return
        self.ck.fail(what, "did not raise")

    def reduced_first(self, what, make_cb):
        """A backward with `make_cb()` on new data, checked against
        all_reduce of a plain backward's gradients on the same data made
        after it, as the first nncomm call after a stopped backward must
        be the callback's (the other ranks wait for it to close that one).
        Returns the RuntimeWarnings the callback's backward gave."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                self.backward(make_cb())
            except Exception as e:
                self.ck.fail(what, f"backward raised {exception_chain(e)}")
                return []
        reduced = [np.array(p.grad.data) for p in self.params]
        self.backward(same_data=True)
        self.check_mean(what, reduced, world_gather(self.grads))
        return [str(w.message) for w in caught
                if issubclass(w.category, RuntimeWarning)]

    def check_mean(self, what, reduced, gathered):
        """`reduced`, one array per parameter, is the mean of every rank's
        gradients `gathered` (world_gather's)."""
        for i, got in enumerate(reduced):
            ref, tol = scaled_reference([gathered[r][i] for r in self.world],
                                        1, True)
            self.ck.array(got, ref, f"{what}: {self.names[i]}", np.float32,
                          tol)

    def correct(self, what, make_cb):
        """A plain backward, then one with `make_cb()`: equal to all_reduce
        of the plain one's gradients."""
        self.backward()
        gathered = world_gather(self.grads)
        try:
            self.backward(make_cb(), same_data=True)
        except Exception as e:
            self.ck.fail(what, f"backward raised {exception_chain(e)}")
            return
        self.check_mean(what, self.grads, gathered)


def failing_hook(ranks, at=3):
    calls = [0]

    def hook(f):
        calls[0] += 1
        if calls[0] == at and ranks:
            raise Stop("the user's hook stops backward")
    return hook


def stopped_unseen(s, new_each_step, on_ranks):
    """A lambda chain: nncomm does not see the exception."""
    comm = s.comm
    pack = 5 if new_each_step else 6
    once = comm.all_reduce_callback(s.grads, pack, division=True)

    def cb():
        return comm.all_reduce_callback(s.grads, pack, division=True) \
            if new_each_step else once

    here = comm.rank in on_ranks
    stop = failing_hook(here)
    chained = cb()
    what = (f"stopped by an unseen exception on ranks {on_ranks}, "
            f"{'new' if new_each_step else 'one'} callback")
    s.raises(what + ": the stopping backward raises",
             lambda: s.backward(lambda f: (stop(f), chained(f))),
             "Stop" if here else "another rank")
    warned = s.reduced_first(f"{what}: the next backward", cb)
    s.ck.true(any("closed as failed" in w for w in warned) == here,
              f"{what}: the next backward warns where it stopped only",
              str(warned))
    for step in range(2):
        s.correct(f"{what}: step {step + 1} after", cb)


def stopped_seen(s, on_ranks):
    """nncomm.chain_hooks: closed at once, the next backward goes on."""
    comm = s.comm
    here = comm.rank in on_ranks
    what = f"stopped by an exception in chain_hooks on ranks {on_ranks}"
    s.raises(what + ": the stopping backward raises",
             lambda: s.backward(nncomm.chain_hooks(
                 failing_hook(here),
                 comm.all_reduce_callback(s.grads, 7, division=True))),
             "Stop" if here else "another rank")
    for step in range(2):
        s.correct(f"{what}: step {step + 1} after",
                  lambda: comm.all_reduce_callback(s.grads, 7,
                                                   division=True))


def chained_twice(s):
    comm = s.comm
    import nnabla as nn
    unused = nn.parameter.get_parameter_or_create(
        "lifecycle/unused", (3,), np.ones(3, np.float32))
    for what, first, second in [
            ("the same callback chained twice", None, None),
            # No bucket at all: only the reduction at the end, which two
            # callbacks would make twice.
            ("two callbacks over the same gradients outside the graph",
             [unused.grad], [unused.grad]),
            ("two callbacks over the same gradients", s.grads, s.grads),
            ("two callbacks over overlapping gradients", s.grads[:3],
             s.grads[2:])]:
        a = comm.all_reduce_callback(first or s.grads, 9)
        b = a if second is None else comm.all_reduce_callback(second, 9)
        s.raises(what + " raises", lambda: s.backward(
            nncomm.chain_hooks(a, b)), "two callbacks")
        s.correct(what + ": the next backward",
                  lambda: comm.all_reduce_callback(s.grads, 9,
                                                   division=True))


def with_analysis(change, fn):
    """Runs `fn` with every new graph analysis passed through `change`."""
    real = core.analyze

    def patched(root, positions):
        graph = real(root, positions)
        change(graph)
        return graph
    core.analyze = patched
    try:
        fn()
    finally:
        core.analyze = real


def phantom(graph):
    """Predicts one more function, never called, writing gradient 0."""
    from nnabla.functions import tanh
    import nnabla as nn
    f = tanh(nn.Variable((1,), need_grad=True)).parent
    graph.consumers[f] = (len(graph.functions), (0,))
    graph.functions.append(f)
    graph.counts[0] += 1
    graph.phantom_keepalive = f


def missing(graph):
    """Forgets the last function that writes no registered gradient."""
    gone = next(f for f in reversed(graph.functions)
                if not graph.consumers[f][1] and f is not graph.functions[0])
    graph.functions.remove(gone)
    del graph.consumers[gone]
    for k, f in enumerate(graph.functions):
        graph.consumers[f] = (k, graph.consumers[f][1])


def mispredicted(s):
    comm = s.comm
    solver = S.Sgd(0.1)
    solver.set_parameters(dict(zip(s.names, s.params)))

    def phantom_then_update():
        s.backward()
        gathered = world_gather(s.grads)
        s.backward(comm.all_reduce_callback(s.grads, 11, division=True),
                   same_data=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            solver.update()
        s.ck.true(any("when a solver started" in str(w.message)
                      for w in caught),
                  "an analysis predicting a function backward never calls: "
                  "the solver step warns", str(caught))
        s.check_mean("... and the solver gets the reduced gradients",
                     s.grads, gathered)
        same = world_gather([p.data for p in s.params])
        s.ck.true(all(np.array_equal(a, b) for r in s.world
                      for a, b in zip(same[0], same[r])),
                  "... so the parameters stay equal on every rank")

    def phantom_then_backward():
        s.backward(comm.all_reduce_callback(s.grads, 12, division=True))

    with_analysis(phantom, phantom_then_backward)
    what = ("an analysis predicting a function backward never calls, no "
            "solver: the next backward")
    warned = s.reduced_first(what, lambda: comm.all_reduce_callback(
        s.grads, 12, division=True))
    s.ck.true(any("closed as failed" in w for w in warned),
              f"{what} warns", str(warned))
    s.correct("the step after that",
              lambda: comm.all_reduce_callback(s.grads, 12, division=True))

    with_analysis(missing, lambda: s.raises(
        "an analysis missing a function backward calls: backward raises",
        lambda: s.backward(comm.all_reduce_callback(s.grads, 13)),
        "did not expect"))
    s.correct("the step after that",
              lambda: comm.all_reduce_callback(s.grads, 13, division=True))


def engines_kept(s):
    """Engines (one thread each, per set of gradients) are kept within a
    memory bound, per group: rank 0 alone makes 40 in a group of its own,
    more than the bound holds, and the world callback made before them is
    still the same engine on every rank (dropped on rank 0 only, its next
    backward would wait for a new engine there and hang)."""
    comm = s.comm
    kept = comm.all_reduce_callback(s.grads, 1 << 20, division=True)
    s.correct("the world callback", lambda: kept)
    comm.new_group(("rank 0 alone", [0]))
    if comm.rank == 0:
        before = len(os.listdir("/proc/self/task"))
        for k in range(40):
            s.backward(comm.all_reduce_callback(s.grads, 4096 + k,
                                                group="rank 0 alone"))
        made = len(os.listdir("/proc/self/task")) - before
        s.ck.true(0 < made <= 32, "engine threads kept within the bound",
                  f"{made} threads more after 40 callbacks")
    s.correct("the world callback after rank 0's own", lambda: kept)


def main():
    ck = Checker("callback_lifecycle")
    comm, _ = make_comm()
    s = Steps(ck, comm)
    everyone, first = s.world, [0]
    for on_ranks in ([everyone, first] if comm.size > 1 else [everyone]):
        for new_each_step in (True, False):
            stopped_unseen(s, new_each_step, on_ranks)
        stopped_seen(s, on_ranks)
    chained_twice(s)
    mispredicted(s)
    engines_kept(s)
    ck.finish()


main()
