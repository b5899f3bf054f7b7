"""Which functions nnabla's backward will call, and which of them write
each gradient: the readiness counts of ``all_reduce_callback``.

It follows nnabla 1.39's own traversal (``visit_function_backward`` and
``BackwardCallback`` in ``computation_graph/variable.cpp``): starting from
the root's parent, a function is called when its ``need_grad`` is set
(otherwise skipped, and nothing behind it is opened through it); a called
function writes the gradient of each input whose ``need_grad`` is set, and
opens the parent of each such input. An input whose ``need_grad`` is False
stops backward there even when its parent needs grad: the stop-gradient of
GAN training (``fake.need_grad = False``).

The flags are read as nnabla reads them during backward:
``Function.need_grad`` as the last forward set it, ``Variable.need_grad``
as it is now (setting it takes effect at once).
"""


class BackwardGraph:
    """The result of :func:`analyze`.

    Attributes:
        consumers (dict): each function backward will call (an
            ``nnabla.function.Function``; equal wrappers hash alike) to
            ``(index, written)``: its place in `functions`, and the tuple of
            positions, in the gradient list, of the gradients its backward
            writes.
        counts (list of int): per gradient, how many called functions write
            it; 0 for gradients the graph does not reach.
        reached (tuple of int): the positions whose count is not 0.
        functions (list): the called functions, in discovery order.
        forward (tuple of float): per gradient, its priority under
            ``priority="forward"``: minus the rank of the last function
            of backward to write it (backward calls functions by
            descending rank), so that the gradients backward makes final
            last, which the next forward uses first, come first; 0 for
            gradients not reached.
    """

    def __init__(self, consumers, counts, functions, watched, forward):
        self.consumers = consumers
        self.counts = counts
        self.reached = tuple(i for i, c in enumerate(counts) if c > 0)
        self.forward = forward
        self.functions = functions
        self._watched = watched
        self._flags = need_grad_flags(watched)
        self._inputs = None

    def still_valid(self):
        """Whether every flag the analysis read still reads the same (a
        parameter frozen, or ``need_grad`` set on an intermediate, since
        changes which functions are called). Checked before every backward:
        one flat pass, the cost of a read per flag."""
        return need_grad_flags(self._watched) == self._flags

    def feeds_a_called_function(self, f):
        """Whether an output of `f` is an input of a function this analysis
        says backward calls: then backward calling `f` means the analysis
        missed it, while any other function starts another backward."""
        if self._inputs is None:
            self._inputs = {v for g in self.functions for v in g.inputs
                            if v.parent is not None}
        return any(v in self._inputs for v in f.outputs)


def need_grad_flags(watched):
    """The flags that decide what backward calls: ``need_grad`` of each
    function and variable in `watched`."""
    return [x.need_grad for x in watched]


def analyze(root, positions):
    """Analyses the backward pass that starts at function `root`.

    Args:
        root (nnabla.function.Function): the first function backward calls
            (the parent of the variable backward was called on).
        positions (dict): gradient ``NdArray`` to its position in the list
            of gradients.

    Returns:
        :obj:`BackwardGraph`

    Example:

    .. code-block:: python

        called = []
        loss.backward(function_post_hook=called.append)
        graph = analyze(called[0], {p.grad: i for i, p in enumerate(params)})
        assert set(graph.consumers) == set(called)
    """
    counts = [0] * len(positions)
    forward = [0.0] * len(positions)
    consumers = {}
    functions = []
    # Every function opened, called or skipped, and the inputs whose flag
    # matters: intermediates (opened or not) and registered gradients'
    # leaves. Kept as the Variables read, since making f.inputs again each
    # iteration would cost more than the check.
    watched = []
    stack = [root]
    opened = {root}
    while stack:
        f = stack.pop()
        inputs = f.inputs
        watched.append(f)
        watched += [v for v in inputs if v.parent is not None
                    or positions.get(v.grad) is not None]
        if not f.need_grad:
            continue
        written = gradients_written(inputs, positions)
        for v in inputs:
            if not v.need_grad:
                continue  # no gradient written, nothing opened behind it
            parent = v.parent
            if parent is not None and parent not in opened:
                opened.add(parent)
                stack.append(parent)
        for i in written:
            counts[i] += 1
            forward[i] = -f.rank if counts[i] == 1 else \
                max(forward[i], -f.rank)
        consumers[f] = (len(functions), tuple(written))
        functions.append(f)
    return BackwardGraph(consumers, counts, functions, watched,
                         tuple(forward))


def gradients_written(inputs, positions):
    """The positions, in the gradient list, of the gradients a called
    function with `inputs` writes: those of its leaf inputs whose
    ``need_grad`` is set, once each.

    Args:
        inputs (list of nnabla.Variable): The function's inputs.
        positions (dict): gradient ``NdArray`` to its position.

    Returns:
        list of int
    """
    written = []
    for v in inputs:
        if v.need_grad and v.parent is None:
            i = positions.get(v.grad)
            if i is not None and i not in written:
                written.append(i)
    return written


def functions_behind(loss):
    """Yields every function of the graph that computed `loss`, once each,
    with its inputs (a list read once: nnabla builds it anew per read).

    Args:
        loss (nnabla.Variable): The output of a forward.

    Yields:
        tuple: (function, inputs).
    """
    stack = [loss.parent] if loss.parent is not None else []
    opened = set(stack)
    while stack:
        f = stack.pop()
        inputs = f.inputs
        yield f, inputs
        for v in inputs:
            if v.parent is not None and v.parent not in opened:
                opened.add(v.parent)
                stack.append(v.parent)


def samples_in(loss, parameters):
    """The number of samples `loss` was computed on: the first dimension of
    the graph's data inputs (its leaves other than `parameters`).

    Args:
        loss (nnabla.Variable): The output of a forward.
        parameters (iterable of nnabla.Variable): The model's parameters,
            left out of the inputs.

    Returns:
        int

    Raises:
        ValueError: the graph has no data input, or its inputs disagree
            on the first dimension; then only the caller knows.
    """
    params = {v.data for v in parameters}
    sizes = {v.shape[0] for _, inputs in functions_behind(loss)
             for v in inputs
             if v.parent is None and v.shape and v.data not in params}
    if len(sizes) != 1:
        raise ValueError(
            f"cannot tell the number of samples from the graph: its data "
            f"inputs have first dimensions {sorted(sizes)}; pass "
            f"num_samples=")
    return sizes.pop()
