"""Graphs the way nnabla users build them, for the tests of
all_reduce_callback's backward-graph analysis: stop-gradient (GAN) graphs,
frozen layers, persistent and unlinked variables, shared weights, several
roots of one graph, a loss that reaches no registered gradient; and
(BY_RANK) graphs whose backward reaches other parameters on other ranks.

Each builder makes a fresh graph in its own parameter scope and returns a
:class:`Graph`. Nothing here communicates, so the single-process tests and
the MPI workers share it.
"""
import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF


class Graph:
    """A loss to call backward on, its input Variables, and the parameters
    whose gradients a callback reduces (in the order of its `data`).

    `forward_kwargs`/`backward_kwargs` are how the graph is meant to be run
    (e.g. ``clear_no_need_grad``); `prepare`, when given, is what a training
    loop does at the start of each step (e.g. set ``need_grad`` flags, as a
    loop alternating two losses does): :meth:`next_step` calls it.
    """

    def __init__(self, name, loss, inputs, params, forward_kwargs=None,
                 backward_kwargs=None, prepare=None):
        self.name, self.loss, self.inputs = name, loss, inputs
        self.names = list(params)
        self.params = list(params.values())
        self.forward_kwargs = forward_kwargs or {}
        self.backward_kwargs = backward_kwargs or {}
        self.prepare = prepare

    def grads(self):
        return [p.grad for p in self.params]

    def feed(self, values):
        """Sets each input from `values(name, shape)`."""
        for name, v in self.inputs.items():
            v.d = values(name, v.shape)

    def next_step(self):
        if self.prepare is not None:
            self.prepare()

    def run(self, hook=None, route="hook"):
        """forward, gradients zeroed, backward with the callback `hook` as
        the function_post_hook (`route` "hook") or in
        communicator_callbacks ("callbacks")."""
        self.loss.forward(**self.forward_kwargs)
        for p in self.params:
            p.grad.zero()
        if route == "callbacks":
            self.loss.backward(communicator_callbacks=hook,
                               **self.backward_kwargs)
        else:
            self.loss.backward(function_post_hook=hook,
                               **self.backward_kwargs)


def _scope_params(scope):
    with nn.parameter_scope(scope):
        return nn.get_parameters(grad_only=False)


def _mlp(h, widths, name):
    for i, w in enumerate(widths):
        h = PF.affine(h, w, name=f"{name}{i}")
        if i + 1 < len(widths):
            h = F.tanh(h)
    return h


def gan_need_grad_false(registered="d"):
    """The GAN idiom: fake = G(z); fake.need_grad = False; loss = D(fake).
    Backward stops at `fake`: G's functions are never called. `registered`:
    'd' (D's parameters, as a discriminator's solver has), or 'gd' (G's as
    well: those stay unreached)."""
    np.random.seed(11)
    scope = f"gan_ng_{registered}"
    with nn.parameter_scope(scope):
        z, real = nn.Variable((4, 3)), nn.Variable((4, 5))
        with nn.parameter_scope("g"):
            fake = F.tanh(_mlp(z, (6, 5), "l"))
        fake.need_grad = False
        with nn.parameter_scope("d"):
            d_fake = _mlp(fake, (7, 1), "l")
        with nn.parameter_scope("d"):
            d_real = _mlp(real, (7, 1), "l")
        loss = F.mean(F.softplus(d_fake)) + F.mean(F.softplus(-d_real))
    params = _scope_params(f"{scope}/d") if registered == "d" else \
        _scope_params(scope)
    return Graph(f"gan_need_grad_false_{registered}", loss,
                 {"z": z, "real": real}, params)


def gan_unlinked():
    """nnabla's DCGAN example: the discriminator's loss on
    fake.get_unlinked_variable(need_grad=True), the generator's loss on
    `fake` itself, both registered gradients sets reduced by one callback
    per loss."""
    np.random.seed(12)
    with nn.parameter_scope("gan_unlinked"):
        z = nn.Variable((4, 3))
        with nn.parameter_scope("g"):
            fake = F.tanh(_mlp(z, (6, 5), "l"))
        fake.persistent = True
        fake_dis = fake.get_unlinked_variable(need_grad=True)
        with nn.parameter_scope("d"):
            d = _mlp(fake_dis, (7, 1), "l")
        loss = F.mean(F.softplus(d))
    return Graph("gan_unlinked", loss, {"z": z},
                 _scope_params("gan_unlinked"))


def stop_gradient_mid_chain():
    """need_grad=False on an intermediate inside one model: the layers
    before it get no gradient, though their parameters need one."""
    np.random.seed(13)
    with nn.parameter_scope("stop_mid"):
        x, t = nn.Variable((3, 4)), nn.Variable((3, 2))
        h = F.tanh(PF.affine(x, 5, name="a"))
        h = F.tanh(PF.affine(h, 5, name="b"))
        h.need_grad = False
        h = PF.affine(F.relu(h), 4, name="c")
        loss = F.sum(F.squared_error(PF.affine(h, 2, name="d"), t))
    return Graph("stop_gradient_mid_chain", loss, {"x": x, "t": t},
                 _scope_params("stop_mid"))


def stop_gradient_one_branch():
    """Two branches from one trunk, one of them cut by need_grad=False:
    the trunk's parameters get gradient only through the other branch."""
    np.random.seed(14)
    with nn.parameter_scope("stop_branch"):
        x = nn.Variable((3, 4))
        trunk = F.tanh(PF.affine(x, 6, name="trunk"))
        cut = F.identity(trunk)
        cut.need_grad = False
        left = PF.affine(cut, 3, name="left")
        right = PF.affine(trunk, 3, name="right")
        loss = F.sum(left * right)
    return Graph("stop_gradient_one_branch", loss, {"x": x},
                 _scope_params("stop_branch"))


def frozen_first_layers():
    """fix_parameters=True on the first layers (transfer learning): the
    frozen layers' functions need no grad and are skipped."""
    np.random.seed(15)
    with nn.parameter_scope("frozen_first"):
        x, t = nn.Variable((3, 4)), nn.Variable((3, 2))
        h = F.relu(PF.affine(x, 5, name="f0", fix_parameters=True))
        h = F.relu(PF.affine(h, 5, name="f1", fix_parameters=True))
        loss = F.mean(F.squared_error(PF.affine(h, 2, name="head"), t))
    return Graph("frozen_first_layers", loss, {"x": x, "t": t},
                 _scope_params("frozen_first"))


def _direct_middle_weight(scope, seed):
    """Three layers in `scope`, the middle weight W used directly (not
    through a parametric function, which puts an unlinked copy in the
    graph): the inputs x and t, W and the loss."""
    np.random.seed(seed)
    with nn.parameter_scope(scope):
        x, t = nn.Variable((3, 4)), nn.Variable((3, 2))
        h = F.tanh(PF.affine(x, 5, name="a"))
        W = nn.parameter.get_parameter_or_create(
            "mid", (5, 5), np.random.randn(5, 5).astype(np.float32) / 3)
        h = F.tanh(F.affine(h, W))
        loss = F.mean(F.squared_error(PF.affine(h, 2, name="b"), t))
    return x, t, W, loss


def frozen_parameter_flag():
    """A weight used directly (not through a parametric function, which
    puts an unlinked copy in the graph), frozen by need_grad=False between
    trained layers; its gradient stays unreached."""
    x, t, W, loss = _direct_middle_weight("frozen_flag", 16)
    params = _scope_params("frozen_flag")

    def freeze():
        W.need_grad = False

    return Graph("frozen_parameter_flag", loss, {"x": x, "t": t}, params,
                 prepare=freeze)


def input_needs_grad():
    """An input with need_grad=True (adversarial examples): its gradient
    is written but not registered."""
    np.random.seed(17)
    with nn.parameter_scope("input_grad"):
        x = nn.Variable((3, 4), need_grad=True)
        t = nn.Variable((3, 2))
        loss = F.mean(F.squared_error(_mlp(x, (5, 2), "l"), t))
    return Graph("input_needs_grad", loss, {"x": x, "t": t},
                 _scope_params("input_grad"))


def persistent_and_cleared():
    """A persistent intermediate, run with clear_no_need_grad and
    clear_buffer, as memory-saving training loops do."""
    np.random.seed(18)
    with nn.parameter_scope("persistent"):
        x, t = nn.Variable((3, 4)), nn.Variable((3, 2))
        h = F.tanh(PF.affine(x, 5, name="a"))
        h.persistent = True
        h = F.sigmoid(PF.affine(h, 5, name="b"))
        loss = F.mean(F.squared_error(PF.affine(h, 2, name="c"), t))
    return Graph("persistent_and_cleared", loss, {"x": x, "t": t},
                 _scope_params("persistent"),
                 forward_kwargs={"clear_no_need_grad": True},
                 backward_kwargs={"clear_buffer": True})


def identity_and_unlinked():
    """F.identity in the chain and an unlinked copy with need_grad=True:
    backward stops at the unlinked variable (no parent)."""
    np.random.seed(19)
    with nn.parameter_scope("unlinked"):
        x, t = nn.Variable((3, 4)), nn.Variable((3, 2))
        h = F.identity(F.tanh(PF.affine(x, 5, name="a")))
        u = h.get_unlinked_variable(need_grad=True)
        h = F.identity(PF.affine(u, 5, name="b"))
        loss = F.mean(F.squared_error(PF.affine(h, 2, name="c"), t))
    return Graph("identity_and_unlinked", loss, {"x": x, "t": t},
                 _scope_params("unlinked"))


def shared_weights():
    """A weight used by three functions of a chain and by a parallel
    branch (tied weights, RNN-like)."""
    np.random.seed(20)
    with nn.parameter_scope("shared_w"):
        x, t = nn.Variable((4, 5)), nn.Variable((4, 5))
        W = nn.parameter.get_parameter_or_create(
            "W", (5, 5), np.random.randn(5, 5).astype(np.float32) / 3)
        b = nn.parameter.get_parameter_or_create(
            "b", (5,), np.random.randn(5).astype(np.float32))
        h = x
        for _ in range(3):
            h = F.tanh(F.affine(h, W, b))
        h = h + F.affine(x, W)
        loss = F.sum(F.squared_error(h, t))
    return Graph("shared_weights", loss, {"x": x, "t": t},
                 _scope_params("shared_w"))


def several_roots():
    """Two losses of one trunk summed into the loss backward starts from,
    one of them through a stop-gradient."""
    np.random.seed(21)
    with nn.parameter_scope("roots"):
        x, t = nn.Variable((3, 4)), nn.Variable((3, 2))
        trunk = F.tanh(PF.affine(x, 6, name="trunk"))
        l1 = F.mean(F.squared_error(PF.affine(trunk, 2, name="h1"), t))
        cut = F.identity(trunk)
        cut.need_grad = False
        l2 = F.mean(PF.affine(cut, 2, name="h2"))
        loss = l1 + 0.5 * l2
    return Graph("several_roots", loss, {"x": x, "t": t},
                 _scope_params("roots"))


def loss_reaches_no_parameter():
    """A loss whose graph holds no registered gradient (only frozen
    layers): backward calls functions, none writes a registered gradient."""
    np.random.seed(22)
    with nn.parameter_scope("no_param"):
        x = nn.Variable((3, 4), need_grad=True)
        frozen = PF.affine(x, 3, name="frozen", fix_parameters=True)
        loss = F.sum(F.tanh(frozen))
        with nn.parameter_scope("trained"):
            PF.affine(x, 2, name="elsewhere")  # registered, in no graph here
    return Graph("loss_reaches_no_parameter", loss, {"x": x},
                 _scope_params("no_param"))


def alternating_gan():
    """One generator/discriminator graph, trained alternately by setting
    need_grad on `fake` before each forward: the discriminator step
    (fake.need_grad False) and the generator step (True) call different
    functions on the same root."""
    np.random.seed(23)
    with nn.parameter_scope("alt"):
        z = nn.Variable((4, 3))
        with nn.parameter_scope("g"):
            fake = F.tanh(_mlp(z, (6, 5), "l"))
        with nn.parameter_scope("d"):
            loss = F.mean(F.softplus(_mlp(fake, (7, 1), "l")))
    params = _scope_params("alt")
    state = {"step": 0}

    def alternate():
        fake.need_grad = state["step"] % 2 == 1
        state["step"] += 1

    return Graph("alternating_gan", loss, {"z": z}, params,
                 prepare=alternate)


def task_per_rank(rank):
    """Multi-task training with each rank's batch of one task: two heads
    on one trunk, rank 0's loss through the first, rank 1's through the
    second, rank 2's through neither (an input-gradient loss that reaches
    no parameter); the ranks' backwards reach different parameters."""
    np.random.seed(24)
    with nn.parameter_scope("tasks"):
        x, t = nn.Variable((3, 4)), nn.Variable((3, 2))
        trunk = F.tanh(PF.affine(x, 5, name="trunk"))
        heads = [PF.affine(trunk, 2, name=f"head{k}") for k in range(2)]
        probe = nn.Variable((3, 2), need_grad=True)
        losses = [F.mean(F.squared_error(h, t)) for h in heads] + \
            [F.sum(F.tanh(probe) * t)]
    return Graph(f"task_per_rank[{rank}]", losses[rank % 3],
                 {"x": x, "t": t, "probe": probe}, _scope_params("tasks"))


def frozen_on_alternate_ranks(rank):
    """A middle weight frozen (need_grad False) on every other rank, in
    turn, step by step: each rank's backward reaches it every other step,
    and at each step some ranks' reach it and others' do not."""
    x, t, W, loss = _direct_middle_weight("alternate_ranks", 25)
    params = _scope_params("alternate_ranks")
    state = {"step": 0}

    def alternate():
        W.need_grad = (state["step"] + rank) % 2 == 0
        state["step"] += 1

    return Graph(f"frozen_on_alternate_ranks[{rank}]", loss,
                 {"x": x, "t": t}, params, prepare=alternate)


# Graphs that differ between ranks, made for a given rank.
BY_RANK = [task_per_rank, frozen_on_alternate_ranks]

CATALOGUE = [
    lambda: gan_need_grad_false("d"),
    lambda: gan_need_grad_false("gd"),
    gan_unlinked,
    stop_gradient_mid_chain,
    stop_gradient_one_branch,
    frozen_first_layers,
    frozen_parameter_flag,
    input_needs_grad,
    persistent_and_cleared,
    identity_and_unlinked,
    shared_weights,
    several_roots,
    loss_reaches_no_parameter,
    alternating_gan,
]
