"""Start-up state and Python objects over a communicator's groups: a
model's parameters and its solver's state from one rank, and picklable
objects (settings, epoch numbers, data-set splits) from one rank or from
every rank, as Horovod's ``broadcast_parameters``,
``broadcast_optimizer_state``, ``broadcast_object`` and
``allgather_object`` do.

Everything travels through the communicator's own collectives on its named
groups (so on a CUDA context too), and a call that fails on one rank
(parameters that differ, an object that does not pickle) raises on every
rank of the group instead of leaving the others waiting.
"""
import hashlib
import pickle

import numpy as np

import nnabla as nn

# Bytes travel as int64 elements, which every collective carries.
_WORD = np.dtype(np.int64).itemsize


def broadcast_parameters(comm, params, root=0, group="world"):
    """Copies the root's parameter values into every rank's parameters.

    Call it on every rank of the group after creating the parameters, so
    that training starts from the same model everywhere. The ranks first
    agree that they hold the same parameters (names and shapes, one small
    all-gather); the values are then copied bit for bit by one ``bcast``.

    Args:
        comm (:obj:`nncomm.Communicator`): An initialized communicator.
        params (dict or list): Names to :obj:`nnabla.Variable`, as from
            ``nn.get_parameters()`` (matched by name, in any order), or a
            list of Variables (matched by position).
        root (int): Group rank whose values every rank takes.
        group (str): Name of a group.

    Raises:
        ValueError: On every rank, when the ranks pass different names or
            shapes, or ``root`` is out of the group's range.
        TypeError: Where ``params`` is not such a dict or list (the other
            ranks raise ValueError).

    Example:

    .. code-block:: python

        nncomm.broadcast_parameters(comm, nn.get_parameters())
    """
    entries = _agreed(comm, lambda: _variables(params), group,
                      "broadcast_parameters", "parameters")
    comm.bcast([v.data for _, v in entries], root, group=group)


def broadcast_solver_state(comm, solver, root=0, group="world"):
    """Copies the root's solver state into every rank's solver, so that
    every rank resumes training identically (after ``solver.load_states``
    on the root, say).

    The state is nnabla's :meth:`nnabla.solver.Solver.get_states`: per
    parameter, the arrays of ``SolverState.pstate`` (Adam's moments,
    momentum, ...) and the update count ``t``, copied bit for bit by one
    ``bcast``. Call it on every rank of the group after
    ``solver.set_parameters``; the ranks first agree that their states
    have the same names and shapes.

    Args:
        comm (:obj:`nncomm.Communicator`): An initialized communicator.
        solver (:obj:`nnabla.solver.Solver`): The solver, of the same kind
            on every rank.
        root (int): Group rank whose state every rank takes.
        group (str): Name of a group.

    Raises:
        ValueError: On every rank, when the states' names or shapes differ
            between ranks, or ``root`` is out of the group's range.
        TypeError: Where ``solver`` has no ``get_states`` (the other ranks
            raise ValueError).

    Example:

    .. code-block:: python

        solver.set_parameters(nn.get_parameters())
        if comm.is_main():
            solver.load_states("states.h5")
        nncomm.broadcast_solver_state(comm, solver)
    """
    entries = _agreed(comm, lambda: _state_arrays(solver), group,
                      "broadcast_solver_state", "states")
    states = solver.get_states()
    names = sorted(states)
    steps = _ints([states[name].t for name in names])
    comm.bcast([v.data for _, v in entries] + [steps], root, group=group)
    for name, t in zip(names, steps.data.tolist()):
        states[name].t = t
    solver.set_states(states)


def broadcast_object(comm, obj, root=0, group="world"):
    """The root's ``obj``, pickled, on every rank of the group.

    For trusted jobs only: unpickling runs code chosen by whoever made the
    bytes, so never pass data that came from outside the job.

    Args:
        comm (:obj:`nncomm.Communicator`): An initialized communicator.
        obj: Any picklable object on the root; ignored elsewhere.
        root (int): Group rank whose object is sent.
        group (str): Name of a group.

    Returns:
        ``obj`` itself on the root, an unpickled copy elsewhere.

    Raises:
        pickle.PicklingError: On every rank, with the root's reason, when
            the root's object cannot be pickled.
        pickle.UnpicklingError: On every rank, when a rank cannot unpickle
            it.
        ValueError: On every rank, when ``root`` is out of the group's
            range.

    Example:

    .. code-block:: python

        settings = nncomm.broadcast_object(comm, settings)
    """
    me = _group_rank(comm, group)
    payload, failed = _pickle(obj) if me == root else (b"", False)
    head = _ints([failed, len(payload)])
    comm.bcast(head, root, group=group)
    failed, length = head.data.tolist()
    words = _words(payload, length)
    comm.bcast(words, root, group=group)
    if failed:
        raise pickle.PicklingError(
            f"broadcast_object: the object on group rank {root} of group "
            f"{group!r} cannot be pickled: {_text(words.data, length)}")
    if me == root:
        return _unpickle(comm, group, "broadcast_object", lambda: obj)
    return _unpickle(comm, group, "broadcast_object",
                     lambda: pickle.loads(_bytes(words.data, length)))


def allgather_object(comm, obj, group="world"):
    """Every group rank's ``obj``, pickled, on every rank of the group.

    For trusted jobs only: unpickling runs code chosen by whoever made the
    bytes, so never pass data that came from outside the job. Each rank's
    bytes are padded to the largest's for one all-gather.

    Args:
        comm (:obj:`nncomm.Communicator`): An initialized communicator.
        obj: This rank's picklable object.
        group (str): Name of a group.

    Returns:
        list: The objects in group rank order; this rank's is ``obj``
        itself, the others unpickled copies.

    Raises:
        pickle.PicklingError: On every rank, naming each rank whose object
            cannot be pickled and why.
        pickle.UnpicklingError: On every rank, when a rank cannot unpickle
            an object.

    Example:

    .. code-block:: python

        hosts = nncomm.allgather_object(comm, socket.gethostname())
    """
    me = _group_rank(comm, group)
    payload, failed = _pickle(obj)
    heads = _gather(comm, [failed, len(payload)], group)
    longest = int(heads[:, 1].max())
    words = _words(payload, longest)
    everyone = nn.NdArray((len(heads) * words.size,))
    comm.all_gather(words, everyone, group=group)
    blocks = everyone.data.reshape(len(heads), words.size)
    if heads[:, 0].any():
        raise pickle.PicklingError(
            "allgather_object: objects cannot be pickled: " + "; ".join(
                f"group rank {r}: {_text(blocks[r], length)}"
                for r, (bad, length) in enumerate(heads.tolist()) if bad))
    return _unpickle(comm, group, "allgather_object", lambda: [
        obj if r == me else pickle.loads(_bytes(blocks[r], length))
        for r, (_, length) in enumerate(heads.tolist())])


def _variables(params):
    """`params` as (name, Variable) pairs in the order the ranks pair them:
    by name for a dict, by position for a list."""
    if isinstance(params, dict):
        entries = sorted(params.items())
    elif isinstance(params, (list, tuple)):
        entries = [(str(i), v) for i, v in enumerate(params)]
    else:
        raise TypeError(f"params must be a dict of name to Variable or a "
                        f"list of Variables, not {type(params).__name__}")
    for name, v in entries:
        if not isinstance(v, nn.Variable):
            raise TypeError(f"params[{name!r}] is a {type(v).__name__}, "
                            f"not an nnabla Variable")
    return entries


def _state_arrays(solver):
    """The arrays of `solver`'s state as (parameter/key, Variable) pairs,
    sorted, as the ranks pair them."""
    if not callable(getattr(solver, "get_states", None)):
        raise TypeError(f"solver must be an nnabla Solver, not "
                        f"{type(solver).__name__}")
    states = solver.get_states()
    return [(f"{name}/{key}", states[name].pstate[key])
            for name in sorted(states)
            for key in sorted(states[name].pstate)]


def _agreed(comm, make, group, what, noun, settings=None):
    """`make()`'s (name, Variable) pairs, once every rank of the group has
    made the same names and shapes, and passed the same `settings` (a
    dict), in one all-gather of a digest; ValueError on every rank
    otherwise. A rank where `make` raises TypeError or ValueError takes
    part in the check, so that no rank waits, and then raises it."""
    try:
        entries, error = make(), None
    except (TypeError, ValueError) as e:
        entries, error = None, e
    digest = 0
    if error is None:
        text = repr(([(name, v.shape) for name, v in entries],
                     settings)).encode()
        digest = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(),
                                "little", signed=True)
    heads = _gather(comm, [error is not None, digest], group)
    if error is not None:
        raise error
    if heads[:, 0].any():
        bad = np.flatnonzero(heads[:, 0]).tolist()
        raise ValueError(f"{what}: group ranks {bad} of group {group!r} "
                         f"passed invalid arguments")
    kinds = {}
    for r, d in enumerate(heads[:, 1].tolist()):
        kinds.setdefault(d, []).append(r)
    if len(kinds) > 1:
        also = f" or settings ({', '.join(settings)})" if settings else ""
        raise ValueError(
            f"{what}: the ranks of group {group!r} pass different {noun} "
            f"(names or shapes){also}: " + "; ".join(
                f"group ranks {ranks} one set" for ranks in kinds.values())
            + f"; every rank must pass the same {noun}")
    return entries


def _unpickle(comm, group, what, load):
    """`load()`, or pickle.UnpicklingError on every rank of the group when
    it failed on any."""
    return _on_every_rank(comm, group, load, Exception,
                          lambda bad, here: pickle.UnpicklingError(
                              f"{what}: group ranks {bad} of group "
                              f"{group!r} cannot unpickle what they "
                              f"received{here}"))


def _on_every_rank(comm, group, act, catches, error):
    """`act()`, where it raised none of `catches` on any rank of the group;
    else, on every rank, the exception `error(bad, here)` (chained to this
    rank's own): `bad` the group ranks where it raised, `here` this rank's
    exception as " (here: Type: message)", or "" where it did not raise."""
    try:
        result, raised = act(), None
    except catches as e:
        result, raised = None, e
    heads = _gather(comm, [raised is not None], group)
    if heads.any():
        here = f" (here: {type(raised).__name__}: {raised})" if raised \
            else ""
        raise error(np.flatnonzero(heads[:, 0]).tolist(), here) from raised
    return result


def _group_rank(comm, group):
    """This rank's rank in `group`, or -1 (the collective then says why)."""
    ranks = comm.find_group(group)
    return ranks.index(comm.rank) if comm.rank in ranks else -1


def _gather(comm, values, group):
    """Every group rank's `values` (ints), as rows of an int64 array."""
    mine = _ints(values)
    everyone = nn.NdArray((len(comm.find_group(group)) * mine.size,))
    comm.all_gather(mine, everyone, group=group)
    return everyone.data.reshape(-1, mine.size)


def _pickle(obj):
    """(bytes, failed): the pickle of `obj`, or why it has none."""
    try:
        return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), False
    except Exception as e:
        return f"{type(e).__name__}: {e}".encode(), True


def _ints(values):
    return nn.NdArray.from_numpy_array(np.array(values, np.int64))


def _words(payload, length):
    """`payload` zero-padded into an int64 NdArray of `length` bytes or
    more (at least one element: pickles and messages are never empty)."""
    words = np.zeros(max(1, -(-length // _WORD)), np.int64)
    words.view(np.uint8)[:len(payload)] = np.frombuffer(payload, np.uint8)
    return nn.NdArray.from_numpy_array(words)


def _bytes(words, length):
    return memoryview(np.ascontiguousarray(words).view(np.uint8)[:length])


def _text(words, length):
    return bytes(_bytes(words, length)).decode("utf-8", "replace")
