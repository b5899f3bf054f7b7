"""BlockMomentumSolver: CNTK's block momentum, blockwise model-update
filtering (BMUF; K. Chen and Q. Huo, "Scalable training of deep learning
machines by incremental block training with intra-block parallel
optimization and blockwise model-update filtering", ICASSP 2016). Each rank
trains alone for a block of samples; then the ranks merge what their models
learnt, once, through a momentum filter."""
import math
import numbers

import numpy as np

import nnabla as nn

from nncomm.broadcast import _state_arrays, allgather_object
from nncomm.solver_wrapper import SolverWrapper

# What every rank of the group must pass alike, in the order checked.
_SETTINGS = ("block_size", "block_momentum_as_time_constant",
             "use_nesterov_momentum", "reset_sgd_momentum_after_aggregation",
             "block_learning_rate", "distributed_after")


class BlockMomentumSolver(SolverWrapper):
    r"""Wraps an nnabla solver for block momentum training: CNTK's
    ``block_momentum_distributed_learner`` in nnabla's idiom.

    Each step (:meth:`zero_grad`, :meth:`backward`, :meth:`update`) trains
    this rank's model alone, without communication. Once this rank has
    trained ``block_size // N`` samples since the last synchronization
    (`N` ranks in the group; `block_size` counts the samples of the whole
    group, as CNTK's does), :meth:`update` synchronizes the group in one
    all-reduce. With :math:`w` the model every rank started the block from,
    :math:`w_r` rank r's model, :math:`n` the samples the group trained in
    the block and :math:`\Delta` the block-level update (0 at first):

    .. math::

        G &= \sum_r (w - w_r) \\
        m &= \exp(-n / \tau) \\
        \Delta &\leftarrow m \Delta + (1 - m) \eta G \\
        w &\leftarrow w - \Delta - m \Delta \quad
            \text{(Nesterov; without it } w - \Delta\text{)}

    and every rank's model becomes :math:`w`. :math:`\tau` is
    `block_momentum_as_time_constant`, :math:`\eta` `block_learning_rate`.
    By default :math:`\tau = -\text{block\_size} / \ln(1 - 1/N)`, so
    that :math:`m = (1 - 1/N)^{n / \text{block\_size}}`: :math:`1 - 1/N`
    for a full block (:math:`n` = `block_size`), where :math:`(1 - m) G`
    is the mean of the ranks' deltas. On one rank :math:`m = 0`, and with
    :math:`\eta = 1` the model stays :math:`w_0`'s: local training.

    As CNTK's (``Source/1BitSGD/BlockMomentumDistributedLearner.h``):

    * the deltas are summed, not averaged, and the filter's gain is
      :math:`(1 - m)\eta`;
    * a rank synchronizes at the first update where its count reaches
      ``block_size // N``, and counts the next block from 0: the excess is
      dropped, though :math:`n` includes it;
    * with Nesterov the look-ahead :math:`-m\Delta` stays in :math:`w`:
      the ranks start the next block from it and measure their deltas
      from it;
    * the reset zeroes every state array of the local solver (CNTK's
      ``ResetSmoothedGradients``: the momentum, both of Adam's moments)
      and keeps its step count ``t``.

    Unlike CNTK's:

    * :math:`n` is the sum of the ranks' counts, agreed in the same
      all-reduce, where CNTK takes N times its own count. They are the
      same where every rank trains as many samples per block; where they
      are not, every rank here still computes the same :math:`m` and
      :math:`w`.
    * The warm start ends with the models averaged (below); CNTK's first
      block starts from the model before the warm start, so that its
      first deltas include it.

    Every rank must train as many blocks: a rank that synchronizes once
    more than the others waits for them in the all-reduce.

    The block's start :math:`w` and :math:`\Delta` are two arrays per
    parameter, allocated by :meth:`set_parameters`; the parameters hold
    the deltas while they are reduced.

    Args:
        solver (:obj:`nnabla.solver.Solver`): The local solver, with no
            parameters yet (give them through :meth:`set_parameters`).
        comm (:obj:`nncomm.Communicator`): An initialized communicator.
        block_size (int): Samples per block, over the whole group; at
            least the group's size.
        block_momentum_as_time_constant (float): :math:`\tau`, in samples
            over the group (0: no block momentum); by default from
            :math:`1 - 1/N`, as above.
        use_nesterov_momentum (bool): Start each block from the look-ahead
            :math:`w - m\Delta`. CNTK spells it ``use_nestrov_momentum``.
        reset_sgd_momentum_after_aggregation (bool): Zero the local
            solver's state after each synchronization.
        block_learning_rate (float): :math:`\eta`.
        distributed_after (int): CNTK's warm start: each rank trains its
            first `distributed_after` samples alone, then the ranks average
            their parameters and solver states once
            (``nncomm.warm_start.WarmStart``) and the first block
            starts from that average.
        group (str): Name of the communicator's group to train over.

    Raises:
        TypeError: An argument of the wrong type.
        ValueError: `block_size` below the group's size, a negative or
            infinite time constant, a block learning rate that is not
            positive, a negative `distributed_after`, or this rank not in
            `group`.

    Example:

    .. code-block:: python

        comm = C.MultiProcessDataParallelCommunicator(ctx)
        comm.init()
        solver = nncomm.block_momentum_solver(
            S.Momentum(0.1, 0.9), comm, block_size=64 * comm.size * 8)
        solver.set_parameters(nn.get_parameters())  # rank 0's everywhere
        for x.d, t.d in batches:  # 64 samples per rank: 8 steps a block
            loss.forward()
            solver.zero_grad()
            solver.backward(loss, clear_buffer=True)
            solver.update()
    """

    def __init__(self, solver, comm, block_size,
                 block_momentum_as_time_constant=None,
                 use_nesterov_momentum=True,
                 reset_sgd_momentum_after_aggregation=True,
                 block_learning_rate=1.0, distributed_after=0,
                 group="world"):
        if isinstance(block_size, bool) or \
                not isinstance(block_size, numbers.Integral):
            raise TypeError(f"block_size must be an int (samples), not "
                            f"{type(block_size).__name__}")
        for name, flag in (("use_nesterov_momentum", use_nesterov_momentum),
                           ("reset_sgd_momentum_after_aggregation",
                            reset_sgd_momentum_after_aggregation)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, not "
                                f"{type(flag).__name__}")
        rate = _real(block_learning_rate, "block_learning_rate")
        if not 0 < rate < math.inf:
            raise ValueError(f"block_learning_rate must be positive and "
                             f"finite, not {block_learning_rate!r}")
        super().__init__(solver, comm, group, distributed_after)
        size = len(comm.find_group(group))
        self._period = int(block_size) // size
        if self._period < 1:
            raise ValueError(
                f"block_size counts the samples of all {size} ranks of "
                f"group {group!r}; {block_size} leaves each rank none "
                f"between synchronizations: give {size} or more")
        if block_momentum_as_time_constant is None:
            # CNTK's Momentum2TimeConstant(1 - 1/N, block_size); on one
            # rank, log(0) makes it 0.
            tau = 0.0 if size == 1 else \
                -int(block_size) / math.log(1 - 1 / size)
        else:
            tau = _real(block_momentum_as_time_constant,
                        "block_momentum_as_time_constant")
            if not 0 <= tau < math.inf:
                raise ValueError(
                    f"block_momentum_as_time_constant must be 0 or more "
                    f"and finite (samples), not "
                    f"{block_momentum_as_time_constant!r}")
        self._settings = (int(block_size), tau, use_nesterov_momentum,
                          reset_sgd_momentum_after_aggregation, rate,
                          self._warm_start.after)
        self._tau = tau
        self._nesterov = use_nesterov_momentum
        self._reset = reset_sgd_momentum_after_aggregation
        self._rate = rate
        self._params = None  # the parameters' data, by name
        self._start = None   # w: the model the block started from
        self._delta = None   # the block-level update, Delta
        # This rank's samples in the block, in the all-reduce with the
        # deltas so that every rank gets the group's sum.
        self._count = nn.NdArray.from_numpy_array(np.zeros(1, np.int64))
        self._in_block = 0   # samples trained in this block
        self._pending = 0    # in the backward passes since the last update
        self._passes = 0     # backward passes since the last update

    def set_parameters(self, param_dict, reset=True, retain_state=False):
        """As :meth:`nncomm.DistributedSolver.set_parameters`, once the
        ranks have checked that they pass the same settings; the first
        block starts from the parameters.

        Raises:
            ValueError: On every rank of the group, when the ranks'
                `block_size`, time constant, flags, block learning rate or
                `distributed_after` differ (or their parameters do, as
                :func:`nncomm.broadcast_parameters` says).
        """
        everyone = allgather_object(self._comm, self._settings,
                                    group=self._group)
        differ = [f"{name}: " + ", ".join(
            f"group rank {r} {s[i]!r}" for r, s in enumerate(everyone))
            for i, name in enumerate(_SETTINGS)
            if len({s[i] for s in everyone}) > 1]
        if differ:
            raise ValueError(
                f"BlockMomentumSolver: the ranks of group {self._group!r} "
                f"must train alike, and pass different " + "; ".join(differ))
        super().set_parameters(param_dict, reset, retain_state)

    def _registered(self, params):
        # By name, as every rank pairs them in the all-reduce.
        self._params = [params[name].data for name in sorted(params)]
        self._start = [nn.NdArray(p.shape).copy_from(p)
                       for p in self._params]
        self._delta = [nn.NdArray(p.shape) for p in self._params]
        for d in self._delta:
            d.zero()
        self._in_block = 0
        self._pending = 0
        self._passes = 0

    def _after_join(self, root):
        """comm.join() ended: every rank takes group rank `root`'s model,
        solver state and block (its start, update and samples so far)."""
        super()._after_join(root)
        self._count.fill(self._in_block)
        self._comm.bcast(self._start + self._delta + [self._count], root,
                         group=self._group)
        self._in_block = int(self._count.data[0])

    def zero_grad(self):
        """Zeroes the gradients, and forgets the samples of the backward
        passes since the last update."""
        self._solver.zero_grad()
        self._pending = 0
        self._passes = 0

    def backward(self, loss, clear_buffer=False, num_samples=None,
                 **kwargs):
        """``loss.backward(...)``, counting the samples it trains on.

        Args:
            loss (:obj:`nnabla.Variable`): The loss, after its forward.
            clear_buffer (bool): As :meth:`nnabla.Variable.backward`.
            num_samples (int): Samples in this pass; by default the first
                dimension of the graph's data inputs.
            **kwargs: Passed on to :meth:`nnabla.Variable.backward`.
        """
        if self._params is None:
            raise RuntimeError("set_parameters() first: the solver has no "
                               "parameters to train")
        samples = self._samples_of(loss, num_samples)
        loss.backward(clear_buffer=clear_buffer, **kwargs)
        self._pending += samples
        self._passes += 1

    def update(self, **kwargs):
        """Steps the wrapped solver on this rank's gradients; then, once
        this rank has trained its share of a block, synchronizes the group
        (during the warm start, at its end averages the model instead).

        Raises:
            RuntimeError: No :meth:`backward` since the last update, so no
                samples to count.
        """
        if not self._passes:
            raise RuntimeError(
                "no backward() through this solver since the last update; "
                "update() counts the samples of its backward passes")
        self._solver.update(**kwargs)
        samples, self._pending, self._passes = self._pending, 0, 0
        if not self._warm_start.distributed:
            self._warm_start.trained(samples, self._comm, self._solver,
                                     self._group)
            if self._warm_start.distributed:
                for w, p in zip(self._start, self._params):
                    w.copy_from(p)
            return
        self._in_block += samples
        if self._in_block >= self._period:
            self._synchronize()

    def _synchronize(self):
        """The block's end: the formula of the class's docstring."""
        for w, p in zip(self._start, self._params):
            p *= -1
            p += w
        self._count.fill(self._in_block)
        self._comm.all_reduce(self._params + [self._count],
                              group=self._group)
        samples = int(self._count.data[0])
        # CNTK's TimeConstant2Momentum, which takes 0 for 0.
        m = math.exp(-samples / self._tau) if self._tau else 0.0
        for w, delta, p in zip(self._start, self._delta, self._params):
            delta *= m
            p *= (1 - m) * self._rate
            delta += p
            if self._nesterov:
                p.copy_from(delta)
                p *= 1 + m
                w -= p
            else:
                w -= delta
            p.copy_from(w)
        self._in_block = 0
        if self._reset:
            for _, state in _state_arrays(self._solver):
                state.data.zero()


def block_momentum_solver(solver, comm, block_size,
                          block_momentum_as_time_constant=None,
                          use_nesterov_momentum=True,
                          reset_sgd_momentum_after_aggregation=True,
                          block_learning_rate=1.0, distributed_after=0,
                          group="world"):
    """CNTK's ``cntk.train.distributed.block_momentum_distributed_learner``
    with its signature (the communicator and group added): a
    :class:`BlockMomentumSolver` wrapping `solver`.

    Args:
        solver (:obj:`nnabla.solver.Solver`): The local solver.
        comm (:obj:`nncomm.Communicator`): An initialized communicator.
        block_size (int): Samples per block, over the whole group.
        block_momentum_as_time_constant (float): In samples over the
            group; by default from the block momentum 1 - 1/N.
        use_nesterov_momentum (bool): Nesterov-style block momentum.
        reset_sgd_momentum_after_aggregation (bool): Zero the local
            solver's state after each synchronization.
        block_learning_rate (float): The block learning rate.
        distributed_after (int): Samples each rank trains alone first.
        group (str): Name of the communicator's group to train over.

    Returns:
        :obj:`BlockMomentumSolver`

    Example:

    .. code-block:: python

        solver = nncomm.block_momentum_solver(S.Sgd(0.1), comm, 2048)
        solver.set_parameters(nn.get_parameters())
    """
    return BlockMomentumSolver(
        solver, comm, block_size, block_momentum_as_time_constant,
        use_nesterov_momentum, reset_sgd_momentum_after_aggregation,
        block_learning_rate, distributed_after, group)


def _real(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, not "
                        f"{type(value).__name__}")
    return float(value)
