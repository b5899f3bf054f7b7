"""The backward-graph analysis behind all_reduce_callback, in one process:
its prediction of which functions backward calls, and how many of them
write each gradient, against what nnabla's backward actually does."""
import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import numpy as np

from nncomm.graph import analyze


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
    written = [names[i] for f in called for i in graph.consumers[f]]
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
