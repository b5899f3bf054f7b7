# The list collectives' shared steps: argument checks of the Communicator's
# collectives, and all_reduce's work, which the backward callback also
# runs on the gradients backward did not reach.


cdef Placed reduced_arrays(list arrays, NnablaContext context,
                           bint division, bint zeroing_as_null):
    """The `arrays` (checked distinct) of a reduction (`data`), placed as
    place() places them, each over memory of its own, and floating where
    the reduction averages (`division`)."""
    cdef Placed placed = place(arrays, context, "data", None,
                               zeroing_as_null)
    if not placed.foreign:  # GPU arrays were checked by their memory
        check_disjoint(placed.refs, "data")
    if division:
        check_floating(placed.dtypes, "data")
    return placed


cdef int all_reduce_list(_Group g, list arrays, NnablaContext context,
                         bint division, float scale, bint fuse) except -1:
    """Communicator.all_reduce's work on `arrays` (checked distinct): on
    their device, or on the memory of NdArrays of `context`."""
    cdef Placed placed = reduced_arrays(arrays, context, division, True)
    cdef Materializer materialize = placed.materializer()
    cdef Status status
    with nogil:
        status = deref(g.core).all_reduce(placed.where, placed.refs, division,
                                          scale, fuse, materialize)
    return g.check(status)


cdef int _root(value, str what, _Group g, group) except -1:
    try:
        root = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{what} must be an int, not {type(value).__name__}") from None
    if not 0 <= root < len(g.ranks):
        raise ValueError(
            f"{what}={root} is out of range for group {group!r} of "
            f"{len(g.ranks)} ranks")
    return root


cdef int _check_one(ndarray) except -1:
    """Refuses an `ndarray` that is neither an NdArray nor a GPU array."""
    if not (isinstance(ndarray, NdArray) or is_gpu_array(ndarray)):
        raise TypeError(f"ndarray must be an nnabla NdArray or a GPU array, "
                        f"not {type(ndarray).__name__}")
    return 0


cdef _check_blocks(list arrays, str what, Py_ssize_t block, Py_ssize_t ranks):
    """One array per rank of `block` elements, or one of `ranks` blocks."""
    if len(arrays) == 1 and ranks > 1:
        if elements(arrays[0]) != block * ranks:
            raise ValueError(
                f"{what} is one array of {elements(arrays[0])} elements; "
                f"{ranks} ranks x {block} = {block * ranks} expected")
        return
    if len(arrays) != ranks:
        raise ValueError(
            f"{what} has {len(arrays)} arrays; the group has {ranks} ranks")
    for i, x in enumerate(arrays):
        if elements(x) != block:
            raise ValueError(
                f"{what}[{i}] has {elements(x)} elements; {block} expected "
                f"(the size of ndarray)")
