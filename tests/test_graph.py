"""The backward-graph analysis behind all_reduce_callback, in one process:
its prediction of which functions backward calls, and how many of them
write each gradient, against what nnabla's backward actually does."""
import functools

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import os
import sys

import numpy as np
import pytest

from nncomm.nnabla_adapter.graph import analyze

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "mpi"))
from graph_catalogue import (BY_RANK, CATALOGUE,  # noqa: E402
                             gan_need_grad_false, shared_weights,
                             stop_gradient_mid_chain)

# Every graph, those made per rank as ranks 0 to 2 make them.
ALL_GRAPHS = CATALOGUE + [
    functools.partial(b, r) for b in BY_RANK for r in range(3)]


def graph_with_shared_and_frozen():
    nn.clear_parameters()
    x = nn.Variable((2, 3))
    x.d = np.random.RandomState(0).randn(2, 3)
    w = nn.parameter.get_parameter_or_create(
        "shared", (3, 3), np.eye(3, dtype=np.float32))
    h = F.affine(F.affine(F.affine(x, w), w), w)  # w written by 3 functions
    # A branch needing no grad: its parameters enter the graph with
    # need_grad=False (the registered ones keep their own flag).
    frozen = PF.affine(x, 3, name="frozen", fix_parameters=True)
    unused = nn.parameter.get_parameter_or_create("unused", (4,))
    loss = F.mean(h) + F.mean(frozen)
    return loss, nn.get_parameters(grad_only=False), unused


def test_analysis_matches_nnabla_backward():
    loss, params, unused = graph_with_shared_and_frozen()
    names = list(params)
    positions = {p.grad: i for i, p in enumerate(params.values())}
    loss.forward()
    called = []
    loss.backward(function_post_hook=called.append)
    graph = analyze(called[0], positions)

    # Exactly the functions nnabla called, each once.
    assert len(graph.functions) == len(called)
    assert set(graph.consumers) == set(called)
    counts = dict(zip(names, graph.counts))
    assert counts["shared"] == 3
    assert counts["frozen/affine/W"] == 0 and counts["frozen/affine/b"] == 0
    assert counts["unused"] == 0
    assert [names[i] for i in graph.reached] == ["shared"]
    # Each call that writes a gradient is predicted to write it.
    written = [names[i] for f in called for i in graph.consumers[f][1]]
    assert written.count("shared") == 3
    assert graph.still_valid()


def test_analysis_notices_need_grad_changes():
    loss, params, _ = graph_with_shared_and_frozen()
    positions = {p.grad: i for i, p in enumerate(params.values())}
    loss.forward()
    called = []
    loss.backward(function_post_hook=called.append)
    graph = analyze(called[0], positions)
    assert graph.still_valid()
    # Freeze the shared weight where the graph holds it (parametric
    # functions put their own Variable of each parameter in the graph).
    shared = positions[params["shared"].grad]
    for f in called:
        for v in f.inputs:
            if v.parent is None and positions.get(v.grad) == shared:
                v.need_grad = False
    loss.forward()  # nnabla recomputes need_grad during forward
    assert not graph.still_valid()
    called = []
    loss.backward(function_post_hook=called.append)
    assert called == []  # nothing needs grad any more


# -- every graph of the catalogue, as users build them ----------------------

@pytest.mark.parametrize("build", ALL_GRAPHS,
                         ids=[b().name for b in ALL_GRAPHS])
def test_analysis_matches_nnabla_on_user_graphs(build):
    """Over three training steps (flags may change between them): the
    predicted functions are exactly those nnabla's backward calls, and the
    gradients predicted to be written are exactly those backward wrote
    (left zeroing otherwise)."""
    g = build()
    rng = np.random.RandomState(0)
    for step in range(3):
        g.next_step()
        g.feed(lambda name, shape: rng.randn(*shape).astype(np.float32))
        called = []
        g.run(called.append)
        assert called, f"{g.name}: backward called no function"
        graph = analyze(called[0], {x: i for i, x in enumerate(g.grads())})
        assert len(called) == len(set(called)), f"{g.name}: a function twice"
        assert set(graph.consumers) == set(called), (
            f"{g.name} step {step}: predicted "
            f"{sorted(f.name for f in graph.consumers)}, nnabla called "
            f"{sorted(f.name for f in called)}")
        written = [g.names[i] for i, p in enumerate(g.params)
                   if not p.grad.zeroing]
        assert [g.names[i] for i in graph.reached] == written, (
            f"{g.name} step {step}: predicted writes "
            f"{[g.names[i] for i in graph.reached]}, nnabla wrote {written}")
        assert graph.still_valid()


@pytest.mark.parametrize("build", ALL_GRAPHS,
                         ids=[b().name for b in ALL_GRAPHS])
def test_forward_priority_reverses_the_order_gradients_become_final(build):
    """A gradient backward makes final later than another (its last
    writer called later) never has a lower priority="forward"."""
    g = build()
    g.next_step()
    g.feed(lambda name, shape: np.ones(shape, np.float32))
    called = []
    g.run(called.append)
    graph = analyze(called[0], {x: i for i, x in enumerate(g.grads())})
    final = {i: max(k for k, f in enumerate(called)
                    if i in graph.consumers[f][1])
             for i in graph.reached}
    for i in graph.reached:
        for j in graph.reached:
            assert final[i] <= final[j] or \
                graph.forward[i] >= graph.forward[j], (
                    f"{g.name}: {g.names[i]} final after {g.names[j]}, "
                    f"priority {graph.forward[i]} < {graph.forward[j]}")


def test_analysis_notices_a_stop_gradient_set_after_forward():
    """need_grad=False set on an intermediate after forward takes effect
    in the next backward; a cached analysis must see that."""
    g = gan_need_grad_false("gd")
    g.feed(lambda name, shape: np.ones(shape, np.float32))
    called = []
    g.run(called.append)
    graph = analyze(called[0], {x: i for i, x in enumerate(g.grads())})
    fake = next(v for f in called for v in f.inputs
                if v.parent is not None and not v.need_grad)
    fake.need_grad = True
    assert not graph.still_valid()
    fake.need_grad = False
    assert graph.still_valid()


def test_an_unexpected_function_is_told_from_another_backward():
    """A function missing from an analysis but feeding a function it
    predicts belongs to the same backward; a function of another graph
    does not."""
    g = stop_gradient_mid_chain()
    g.feed(lambda name, shape: np.ones(shape, np.float32))
    called = []
    g.run(called.append)
    graph = analyze(called[0], {x: i for i, x in enumerate(g.grads())})
    producer = next(v.parent for f in called for v in f.inputs
                    if v.parent is not None and v.parent not in
                    graph.consumers)
    assert graph.feeds_a_called_function(producer)
    other = shared_weights()
    other.feed(lambda name, shape: np.ones(shape, np.float32))
    other_called = []
    other.run(other_called.append)
    assert not graph.feeds_a_called_function(other_called[0])
