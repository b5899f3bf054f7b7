"""Sharded solver state (ZeRO stage 1, as PyTorch's
``ZeroRedundancyOptimizer``): each rank of a group updates only its own
contiguous range of the parameters' elements, so that the solver's state
(Adam's moments, momenta) exists once over the group instead of once per
rank, and the ranks then all-gather the updated parameters. With sharded
gradients as well (ZeRO stage 2), each element of the callback's buckets
is summed onto its owner alone during backward
(``nncomm._nncomm.OwnerReducing``), and the gradients of parameters a rank
owns nothing of are released once their buckets are written back.

The parameters, flattened in registration order, form one element space of
T elements; group rank r of N owns ``[r*T//N, (r+1)*T//N)``
(:func:`element_ranges`), a parameter possibly straddling ranks. The
wrapped nnabla solver is given one 1-D Variable per (parameter, owned
slice) (:func:`pieces`), whose data and gradient are views of the
parameter's own arrays: nothing is copied in, and the update writes the
owned elements where they lie.

Checkpoints are one ``.npz`` file of state arrays per rank and a JSON
description (element ranges, parameters, solver), so that another number of
ranks can load them (each rank reads the files that cover its range) and
:func:`consolidate_states` can make an ordinary solver's state of them.
"""
import json
import os
import weakref

import numpy as np

import nnabla as nn

from nncomm._nncomm import OwnerReducing
from nncomm.broadcast import _agreed, _gather, _on_every_rank

# Solvers whose update of an element reads the whole parameter (the norms of
# LARS's and LAMB's trust ratios): a slice alone would be updated wrongly.
_WHOLE_PARAMETER = ("Lars", "Lamb")
# Elements per rank gathered at once: the all-gather's buffers stay this
# small (x ranks) whatever the model's size.
_GATHER_ELEMENTS = 1 << 18
_META = "sharded_states.json"
_FORMAT = 1

# Live ShardedSolvers, so that comm.join() can refuse to run beside one.
_live = weakref.WeakSet()


def element_ranges(total, ranks):
    """The contiguous element range [start, stop) each of `ranks` ranks
    owns in a space of `total` elements: rank r's is
    ``[r*total//ranks, (r+1)*total//ranks)``.

    Args:
        total (int): Elements in all.
        ranks (int): Number of ranks.

    Returns:
        list: ``(start, stop)`` per rank, in rank order.
    """
    return [(r * total // ranks, (r + 1) * total // ranks)
            for r in range(ranks)]


def pieces(sizes, start, stop):
    """The slices of parameters that the element range [start, stop)
    covers, for parameters of `sizes` elements laid end to end.

    Args:
        sizes (list of int): Elements of each parameter, in order.
        start (int): First element of the range.
        stop (int): One past its last.

    Returns:
        list: ``(parameter index, begin, end)`` per parameter the range
        holds elements of, begin and end within the parameter, in order.
    """
    found = []
    offset = 0
    for i, size in enumerate(sizes):
        begin, end = max(start, offset), min(stop, offset + size)
        if begin < end:
            found.append((i, begin - offset, end - offset))
        offset += size
    return found


def sharded_solvers(comm):
    """The live :class:`ShardedSolver` objects over `comm`."""
    return [s for s in _live if s._comm is comm]


class ShardedSolver:
    """An nnabla solver's interface over full parameters whose update, and
    state, cover only this rank's range of their elements; the wrapped
    solver holds one shard Variable per owned parameter slice.
    :class:`nncomm.DistributedSolver` wraps its solver in one with
    ``shard="state"`` or ``"gradients"``; every rank must hold the reduced
    gradients of the elements it owns when :meth:`update` is called.

    Methods that read or change gradients (``weight_decay``,
    ``scale_grad``, ``clip_grad_by_norm``, the ``check_*_grad`` ones) act
    on this rank's shard, which is what its update reads, and combine over
    the group what needs the whole parameter or every rank (norms,
    findings). :meth:`get_states` and :meth:`set_states` are the shard's
    states; :meth:`save_states` and :meth:`load_states` write and read
    checkpoints that any number of ranks can load.

    Args:
        solver (:obj:`nnabla.solver.Solver`): The solver to wrap, with no
            parameters; not LARS or LAMB, whose update of an element reads
            its whole parameter.
        comm (:obj:`nncomm.Communicator`): An initialized communicator.
        group (str): The group whose ranks share the state.
        shard (str): ``"state"`` or ``"gradients"``, for messages.

    Raises:
        ValueError: `solver` is LARS or LAMB.
    """

    def __init__(self, solver, comm, group, shard="state"):
        self._what = f"shard={shard!r}"
        if solver.name in _WHOLE_PARAMETER:
            raise ValueError(
                f"{self._what} cannot shard {solver.name}: its update of an "
                f"element reads the norm of the whole parameter, which a "
                f"rank holding a slice does not have")
        ranks = comm.find_group(group)
        self._solver = solver
        self._comm = comm
        self._group = group
        self._ranks = len(ranks)
        self._me = ranks.index(comm.rank)
        self._params = {}
        self._pieces = []  # (parameter index, begin, end) this rank owns
        self._shards = {}  # shard name -> its Variable (views)
        self._ranges = []
        self._unowned = set()  # gradients of parameters with no piece here
        self._starts = {}  # gradient -> where it begins in the element space
        self._bounds = []  # each rank's first element, then the total
        self._send = self._recv = None  # the all-gather's buffers
        _live.add(self)

    # -- registration ---------------------------------------------------------

    def set_parameters(self, param_dict, reset=True, retain_state=False):
        """Registers the full parameters, and the views of this rank's
        slices of them with the wrapped solver (its state made anew).

        Args:
            param_dict (dict): name -> :obj:`nnabla.Variable`, in the
                same order on every rank (it orders the element space).
            reset (bool): Must be True: the parameters are registered at
                once.
            retain_state (bool): Must be False.

        Raises:
            NotImplementedError: `reset` False or `retain_state` True:
                adding parameters would move every rank's range.
            ValueError: On every rank, when the ranks' parameters differ in
                names, shapes or order, or their arrays are not of one
                dtype.
        """
        if not reset or retain_state:
            raise NotImplementedError(
                f"{self._what} registers every parameter in one "
                "set_parameters(params) call (reset=True, "
                "retain_state=False): parameters added later would move "
                "every rank's range of elements and its state")
        params = _agreed(self._comm, lambda: _in_order(param_dict),
                         self._group, f"DistributedSolver({self._what})",
                         "parameters (in registration order)")
        dtypes = {np.dtype(v.data.dtype) for _, v in params}
        if len(dtypes) > 1:
            raise ValueError(f"{self._what} gathers the parameters in one "
                             f"dtype; they hold {sorted(map(str, dtypes))}")
        self._params = dict(params)
        sizes = [v.size for _, v in params]
        self._ranges = element_ranges(sum(sizes), self._ranks)
        self._pieces = pieces(sizes, *self._ranges[self._me])
        self._shards = {}
        for i, begin, end in self._pieces:
            name, v = params[i]
            shard = nn.Variable((end - begin,), need_grad=True)
            shard.data = v.data.view((v.size,)).narrow(0, begin, end - begin)
            shard.grad = v.grad.view((v.size,)).narrow(0, begin, end - begin)
            self._shards[_shard_name(name, begin, end)] = shard
        self._solver.set_parameters(self._shards)
        owned = {i for i, _, _ in self._pieces}
        self._unowned = {v.grad for i, (_, v) in enumerate(params)
                         if i not in owned}
        offsets = np.cumsum([0] + sizes).tolist()
        self._starts = {v.grad: o for (_, v), o in zip(params, offsets)}
        self._bounds = [a for a, _ in self._ranges] + [offsets[-1]]
        longest = max(b - a for a, b in self._ranges)
        chunk = max(1, min(longest, _GATHER_ELEMENTS // self._ranks))
        dtype = dtypes.pop() if dtypes else np.float32
        self._send = nn.NdArray.from_numpy_array(np.zeros(chunk, dtype))
        self._recv = nn.NdArray.from_numpy_array(
            np.zeros(chunk * self._ranks, dtype))

    def get_parameters(self):
        """dict: the full parameters, name -> Variable, in registration
        order."""
        return dict(self._params)

    @property
    def shards(self):
        """dict: this rank's shard Variables (views of its slices of the
        parameters), named ``"name[begin:end]"``, begin and end within the
        flattened parameter."""
        return dict(self._shards)

    # -- the step -------------------------------------------------------------

    def update(self, **kwargs):
        """Steps this rank's shard, then all-gathers every rank's updated
        elements into the full parameters."""
        self._solver.update(**kwargs)
        self._all_gather()

    def _all_gather(self):
        """Every rank's range of elements from that rank, in pieces of the
        buffers' size (each an all-gather of equal blocks, the shorter
        ranges padded)."""
        chunk = self._send.size
        flats = [v.d.reshape(-1) for v in self._params.values()]
        sizes = [v.size for v in self._params.values()]
        longest = max(b - a for a, b in self._ranges)
        send, recv = self._send.data, self._recv
        start, stop = self._ranges[self._me]
        for at in range(0, longest, chunk):
            count = max(0, min(chunk, stop - start - at))
            _copy_range(flats, sizes, start + at, send[:count], out=True)
            self._comm.all_gather(self._send, self._recv, group=self._group)
            blocks = recv.data.reshape(self._ranks, chunk)
            for r, (a, b) in enumerate(self._ranges):
                count = max(0, min(chunk, b - a - at))
                if r != self._me and count:
                    _copy_range(flats, sizes, a + at, blocks[r, :count],
                                out=False)

    def owner_reducing(self, grads):
        """The bucket hook that sums each element of `grads` onto the rank
        owning it (ZeRO stage 2).

        Args:
            grads (list of :obj:`nnabla.NdArray`): Gradients of registered
                parameters, in a callback's order.

        Returns:
            ``nncomm._nncomm.OwnerReducing``
        """
        return OwnerReducing([self._starts[g] for g in grads], self._bounds)

    @property
    def unowned(self):
        """frozenset: the gradients of the parameters this rank owns no
        element of."""
        return frozenset(self._unowned)

    def release_unowned(self, grads):
        """Releases the memory of those of `grads` that this rank owns no
        element of, as ZeRO stage 2 frees them: each becomes NaN, lazily
        (nnabla allocates it again when written), so that a read of it is
        loudly wrong.

        Args:
            grads (iterable of :obj:`nnabla.NdArray`): Gradients reduced
                onto their owners, and written back.
        """
        for g in grads:
            if g in self._unowned:
                g.fill(np.nan)

    def zero_grad(self):
        """Zeroes the full gradients (every rank reduces all of them)."""
        for v in self._params.values():
            v.grad.zero()

    # -- gradient methods on the shard ----------------------------------------

    def weight_decay(self, decay_rate, pre_hook=None, post_hook=None):
        """As :meth:`nnabla.solver.Solver.weight_decay`, on this rank's
        shard (elementwise, so the update is the unsharded one's)."""
        self._solver.weight_decay(decay_rate, pre_hook=pre_hook,
                                  post_hook=post_hook)

    def scale_grad(self, scale, pre_hook=None, post_hook=None):
        """As :meth:`nnabla.solver.Solver.scale_grad`, on this rank's
        shard."""
        self._solver.scale_grad(scale, pre_hook=pre_hook, post_hook=post_hook)

    def clip_grad_by_norm(self, clip_norm, pre_hook=None, post_hook=None):
        """As :meth:`nnabla.solver.Solver.clip_grad_by_norm`: each
        parameter's gradient is scaled to norm `clip_norm` where its norm
        is larger, the norm of a parameter that straddles ranks summed over
        them (one all-reduce of a value per parameter); this rank's shard
        is scaled.

        Raises:
            NotImplementedError: `pre_hook` or `post_hook` given: nnabla
                calls them around its own per-parameter clipping, which
                this is not.
        """
        if pre_hook is not None or post_hook is not None:
            raise NotImplementedError(
                f"clip_grad_by_norm with {self._what} takes no hooks: the "
                "norms are summed over the ranks, not clipped by nnabla's "
                "per-parameter function the hooks surround")
        squares = np.zeros(len(self._params))
        shards = list(self._shards.values())
        for (i, _, _), shard in zip(self._pieces, shards):
            g = shard.g.astype(np.float64)
            squares[i] = np.dot(g, g)
        total = nn.NdArray.from_numpy_array(squares)
        self._comm.all_reduce(total, group=self._group)
        limit = float(clip_norm)
        for (i, _, _), shard in zip(self._pieces, shards):
            square = float(total.data[i])
            if square > 0 and square > limit * limit:
                g = shard.g
                # nnabla's order of operations: clip_norm * g / norm.
                g[...] = limit * g / np.sqrt(square, dtype=g.dtype)

    def check_inf_grad(self, pre_hook=None, post_hook=None):
        """bool: whether any rank's shard holds an infinite gradient
        (the same answer on every rank of the group)."""
        return self._anywhere(self._solver.check_inf_grad(
            pre_hook=pre_hook, post_hook=post_hook))

    def check_nan_grad(self, pre_hook=None, post_hook=None):
        """bool: whether any rank's shard holds a NaN gradient."""
        return self._anywhere(self._solver.check_nan_grad(
            pre_hook=pre_hook, post_hook=post_hook))

    def check_inf_or_nan_grad(self, pre_hook=None, post_hook=None):
        """bool: whether any rank's shard holds an infinite or NaN
        gradient."""
        return self._anywhere(self._solver.check_inf_or_nan_grad(
            pre_hook=pre_hook, post_hook=post_hook))

    def _anywhere(self, found):
        return bool(_gather(self._comm, [found], self._group).any())

    # -- what passes through --------------------------------------------------

    def set_learning_rate(self, learning_rate):
        """As :meth:`nnabla.solver.Solver.set_learning_rate`."""
        self._solver.set_learning_rate(learning_rate)

    def learning_rate(self):
        """As :meth:`nnabla.solver.Solver.learning_rate`."""
        return self._solver.learning_rate()

    def weight_decay_is_fused(self):
        """As :meth:`nnabla.solver.Solver.weight_decay_is_fused`."""
        return self._solver.weight_decay_is_fused()

    @property
    def name(self):
        """str: the wrapped solver's name."""
        return self._solver.name

    @property
    def info(self):
        """The wrapped solver's ``info``."""
        return self._solver.info

    # -- states ---------------------------------------------------------------

    def get_states(self):
        """dict: the wrapped solver's states of this rank's shard Variables
        (:attr:`shards`), about 1/N of the unsharded solver's."""
        return self._solver.get_states()

    def set_states(self, states):
        """Sets this rank's shard states (as from :meth:`get_states`)."""
        self._solver.set_states(states)

    def save_states(self, path):
        """Writes the group's sharded state into the directory `path`:
        ``sharded_states.json`` (by group rank 0: the parameters' names
        and shapes in order, each rank's element range, the solver) and
        one ``states.<rank>.npz`` per rank (``"<parameter index>/<state
        key>"``: the rank's slice of that state array, and
        ``"<parameter index>/t"``). Every rank of the group calls it.

        Args:
            path (str): A directory every rank can write to (made if
                missing).

        Raises:
            OSError: On every rank, naming the ranks that failed to write.
        """
        def write():
            os.makedirs(path, exist_ok=True)
            # Keyed by the parameter's index: names hold "/" themselves.
            arrays = {}
            states = self._solver.get_states()
            for (i, _, _), shard in zip(self._pieces, self._shards):
                state = states[shard]
                for key, v in state.pstate.items():
                    arrays[f"{i}/{key}"] = np.array(v.d).reshape(-1)
                arrays[f"{i}/t"] = np.array(state.t, np.int64)
            np.savez(os.path.join(path, f"states.{self._me}.npz"), **arrays)
            if self._me == 0:
                meta = {"format": _FORMAT, "solver": self._solver.name,
                        "parameters": [[n, list(v.shape)] for n, v in
                                       self._params.items()],
                        "ranges": self._ranges}
                with open(os.path.join(path, _META), "w") as f:
                    json.dump(meta, f, indent=1)
        self._on_every_rank("save_states", OSError, write)

    def load_states(self, path):
        """Reads a checkpoint of :meth:`save_states`, saved by any number of
        ranks, into this rank's shard state: each rank reads the files
        whose ranges cover its own. Every rank of the group calls it.

        Args:
            path (str): The checkpoint's directory.

        Raises:
            ValueError: On every rank, when the checkpoint's parameters
                (names, shapes, order) or solver are not this solver's, or
                a rank cannot read it.
        """
        def read():
            meta = _read_meta(path)
            _check_matches(meta, self._params, self._solver.name)
            names = list(self._params)
            wanted = [(names[i], a, b) for i, a, b in self._pieces]
            found = _read_slices(path, meta, wanted)
            states = self._solver.get_states()
            for (param, _, _), shard in zip(wanted, self._shards):
                arrays, t = found[param]
                state = states[shard]
                if set(arrays) != set(state.pstate):
                    raise ValueError(
                        f"load_states: {path} holds state {sorted(arrays)} "
                        f"for {param!r}; {self._solver.name} keeps "
                        f"{sorted(state.pstate)}")
                for key, v in state.pstate.items():
                    v.d = arrays[key]
                state.t = t
            self._solver.set_states(states)
        self._on_every_rank("load_states", ValueError, read)

    def _on_every_rank(self, what, kind, act):
        """`act()`, raising `kind` on every rank of the group where it
        failed on any (so that no rank goes on alone)."""
        _on_every_rank(self._comm, self._group, act,
                       (OSError, ValueError, KeyError),
                       lambda bad, here: kind(
                           f"{what}: group ranks {bad} of group "
                           f"{self._group!r} failed{here}"))

    # -- refused --------------------------------------------------------------

    def _refuse(self, what):
        raise NotImplementedError(
            f"{what} is not available with {self._what}: the wrapped "
            f"solver holds views of this rank's slices of the parameters, "
            f"which set_parameters makes for all of them at once")

    def setup(self, params):
        """Refused (nnabla's old name of ``set_parameters``)."""
        self._refuse("setup()")

    def remove_parameters(self, keys):
        """Refused: removing parameters would move every rank's range."""
        self._refuse("remove_parameters()")

    def clear_parameters(self):
        """Refused, as :meth:`remove_parameters`."""
        self._refuse("clear_parameters()")

    def set_states_to_protobuf(self, optimizer):
        """Refused: nnabla's protobuf holds one rank's whole state; use
        :meth:`save_states`."""
        self._refuse("set_states_to_protobuf()")

    def set_states_from_protobuf(self, optimizer_proto):
        """Refused, as :meth:`set_states_to_protobuf`."""
        self._refuse("set_states_from_protobuf()")


def consolidate_states(path, solver):
    """Loads a sharded checkpoint (saved by
    :meth:`nncomm.sharded_state.ShardedSolver.save_states` at any number of
    ranks) into an ordinary nnabla solver, to leave sharding: its
    ``save_states`` then writes nnabla's own file. One process; no
    communication.

    Args:
        path (str): The checkpoint's directory.
        solver (:obj:`nnabla.solver.Solver`): Of the checkpoint's kind,
            with the checkpoint's parameters set (same names and shapes).

    Raises:
        ValueError: The checkpoint's parameters or solver are not
            `solver`'s.

    Example:

    .. code-block:: python

        solver = S.Adam(1e-3)
        solver.set_parameters(nn.get_parameters())
        nncomm.consolidate_states("ckpt/step100", solver)
        solver.save_states("step100.h5")
    """
    meta = _read_meta(path)
    params = solver.get_parameters()
    saved = [n for n, _ in meta["parameters"]]
    _check_matches(meta, {n: params.get(n) for n in saved}
                   if set(saved) == set(params) else params, solver.name)
    found = _read_slices(path, meta, [(n, 0, int(np.prod(shape, dtype=int)))
                                      for n, shape in meta["parameters"]])
    states = solver.get_states()
    for name, state in states.items():
        arrays, t = found[name]
        for key, v in state.pstate.items():
            v.d = arrays[key].reshape(v.shape)
        state.t = t
    solver.set_states(states)


def _in_order(param_dict):
    """`param_dict`'s (name, Variable) pairs, in its order."""
    if not isinstance(param_dict, dict):
        raise TypeError(f"param_dict must be a dict of name to Variable, "
                        f"not {type(param_dict).__name__}")
    for name, v in param_dict.items():
        if not isinstance(v, nn.Variable):
            raise TypeError(f"param_dict[{name!r}] is a {type(v).__name__}, "
                            f"not an nnabla Variable")
    return list(param_dict.items())


def _shard_name(name, begin, end):
    return f"{name}[{begin}:{end}]"


def _copy_range(flats, sizes, start, buffer, out):
    """Copies elements [start, start + len(buffer)) of the parameters'
    element space (`flats`: their flat views) into `buffer` (`out`) or
    from it."""
    at = 0
    for i, begin, end in pieces(sizes, start, start + len(buffer)):
        count = end - begin
        if out:
            buffer[at:at + count] = flats[i][begin:end]
        else:
            flats[i][begin:end] = buffer[at:at + count]
        at += count


def _read_meta(path):
    try:
        with open(os.path.join(path, _META)) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{path} is not a sharded checkpoint: it has no "
                         f"{_META}") from None
    if meta.get("format") != _FORMAT:
        raise ValueError(f"{path}: checkpoint format {meta.get('format')!r}"
                         f", this nncomm reads {_FORMAT}")
    return meta


def _check_matches(meta, params, solver_name):
    """ValueError unless the checkpoint `meta` describes `params` (name ->
    Variable, in order) and a solver named `solver_name`."""
    saved = [(n, tuple(shape)) for n, shape in meta["parameters"]]
    here = [(n, None if v is None else tuple(v.shape))
            for n, v in params.items()]
    if saved != here:
        differ = [f"{a} vs {b}" for a, b in zip(saved, here) if a != b]
        raise ValueError(
            f"the checkpoint holds {len(saved)} parameters, this solver "
            f"{len(here)}; (name, shape) saved vs here: "
            f"{differ[:3] or 'in a different order or number'}")
    if meta["solver"] != solver_name:
        raise ValueError(f"the checkpoint is {meta['solver']}'s state, not "
                         f"{solver_name}'s")


def _read_slices(path, meta, wanted):
    """{parameter: ({key: 1-D array}, t)} for each (parameter, begin, end)
    of `wanted`, assembled from the files of the ranks whose ranges cover
    those elements."""
    names = [n for n, _ in meta["parameters"]]
    index = {n: i for i, n in enumerate(names)}
    sizes = [int(np.prod(shape, dtype=int)) for _, shape in meta["parameters"]]
    offsets = dict(zip(names, np.cumsum([0] + sizes[:-1]).tolist()))
    files = {}
    found = {}
    for param, begin, end in wanted:
        arrays, steps = {}, set()
        o = offsets[param]
        for rank, (a, b) in enumerate(meta["ranges"]):
            lo, hi = max(a, o + begin), min(b, o + end)
            if lo >= hi:
                continue
            if rank not in files:
                files[rank] = np.load(
                    os.path.join(path, f"states.{rank}.npz"))
            saved = files[rank]
            start = max(a, o)  # where the saved slice of param begins
            i = index[param]
            for key in [k.split("/", 1)[1] for k in saved.files
                        if k.split("/", 1)[0] == str(i)]:
                if key == "t":
                    steps.add(int(saved[f"{i}/t"]))
                    continue
                part = saved[f"{i}/{key}"]
                into = arrays.setdefault(key, np.empty(end - begin,
                                                       part.dtype))
                into[lo - o - begin:hi - o - begin] = part[lo - start:
                                                           hi - start]
        if len(steps) != 1:
            raise ValueError(f"{path}: the ranks' step counts of {param!r} "
                             f"differ ({sorted(steps)})")
        found[param] = (arrays, steps.pop())
    return found
