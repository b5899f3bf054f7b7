"""Sparse gradients: an embedding table's gradient reduced as the rows a
step touched, gathered from every rank and summed per row, instead of a
dense all-reduce of the whole table, as TensorFlow's MPI collectives and
Horovod reduce ``IndexedSlices``."""
import numpy as np

import nnabla as nn
import nnabla.functions as F

from nncomm.nnabla_adapter.graph import functions_behind


def embedding_indices(loss, params):
    """The parameters the graph of `loss` uses only as ``Embed`` tables
    (``PF.embed``), with the index Variables that pick their rows: their
    gradients are zero outside those rows.

    Args:
        loss (:obj:`nnabla.Variable`): The output of a forward.
        params (dict): name -> parameter :obj:`nnabla.Variable`.

    Returns:
        tuple: (indices, dense): name -> list of index Variables for the
        tables, and the set of names the graph uses otherwise.
    """
    names = {v.data: name for name, v in params.items()}
    indices, dense = {}, set()
    for f, inputs in functions_behind(loss):
        embed = f.info.type_name == "Embed"
        for position, v in enumerate(inputs):
            name = names.get(v.data)
            if name is None:
                continue
            if embed and position == 1:
                indices.setdefault(name, []).append(inputs[0])
            else:
                dense.add(name)
    return ({name: x for name, x in indices.items() if name not in dense},
            dense)


def touched_rows(index_variables):
    """The sorted distinct rows `index_variables` pick, as int32."""
    return np.unique(np.concatenate(
        [np.asarray(x.d, np.int64).ravel() for x in index_variables]
    )).astype(np.int32)


def sparse_all_reduce(comm, grad, rows, division=False, group="world"):
    """All-reduces a gradient that is zero outside `rows` on this rank:
    each rank's rows and their values are all-gathered (two all-gathers
    with a first dimension per rank) and summed per row into `grad`,
    which ends as ``all_reduce([grad], division)`` would leave it.

    The bytes on the wire are the rows every rank touched, not the table:
    for an embedding of V rows where a step touches k, about k/V of a
    dense reduction's.

    Args:
        comm (:obj:`nncomm.Communicator`): An initialized communicator.
        grad (:obj:`nnabla.NdArray`): The gradient of an embedding table,
            (rows, ...), of one shape on every rank.
        rows (array of int): The rows this rank's gradient may be non-zero
            in; rows elsewhere are taken to be zero (the caller's
            promise: rows left out are lost).
        division (bool): Average over the group instead of summing.
        group (str): Name of a group.

    Raises:
        ValueError: On every rank, when a rank names a row outside the
            table.

    Example:

    .. code-block:: python

        loss.backward()
        nncomm.sparse_all_reduce(comm, W.grad, np.unique(ids.d),
                                 division=True)
    """
    mine = np.unique(np.asarray(rows, np.int64).ravel()).astype(np.int32)
    # Each rank's block opens with its table's rows and its count, so that
    # every rank can check every rank's rows, and raise alike, before the
    # values travel.
    table = grad.shape[0]
    head = np.concatenate([[table, mine.size], mine]).astype(np.int32)
    picked = comm.all_gather(nn.NdArray.from_numpy_array(head), None,
                             group=group).data
    blocks, at = [], 0
    while at < picked.size:
        end = at + 2 + picked[at + 1]
        blocks.append((int(picked[at]), picked[at + 2:end]))
        at = end
    for r, (rows_of_r, chosen) in enumerate(blocks):
        if rows_of_r != table:
            raise ValueError(
                f"sparse_all_reduce: the ranks' tables differ in rows: "
                f"{[b[0] for b in blocks]} by group rank")
        bad = chosen[(chosen < 0) | (chosen >= table)]
        if bad.size:
            raise ValueError(
                f"sparse_all_reduce: group rank {r} names rows outside the "
                f"table's {table}: {bad[:8].tolist()}")
    values = F.gather_nd(grad, nn.NdArray.from_numpy_array(mine[None]))
    every_value = comm.all_gather(values, None, group=group)
    rows_in = np.concatenate([chosen for _, chosen in blocks])
    grad.zero()
    F.scatter_nd(every_value, nn.NdArray.from_numpy_array(rows_in[None]),
                 out=grad, add=True)
    if division:
        grad /= len(blocks)
