"""Which functions nnabla's backward will call, and which of them consume
each gradient: the readiness counts of ``all_reduce_callback``.

It follows nnabla's own traversal (``visit_function_backward``): from the
root's parent function, a function with ``need_grad`` is called and opens the
parents of its inputs whose producing function needs grad; a function
without ``need_grad`` is skipped together with what lies behind it. The
``need_grad`` flags are those nnabla set during the last forward.
"""


class BackwardGraph:
    """The result of :func:`analyze`.

    Attributes:
        consumers (dict): each function backward will call (an
            ``nnabla.function.Function``; equal wrappers hash alike) to the
            tuple of positions, in the gradient list, of the gradients its
            backward writes.
        counts (list of int): per gradient, how many called functions write
            it; 0 for gradients the graph does not reach.
        reached (tuple of int): the positions whose count is not 0.
        functions (list): the called functions, in discovery order.
        need_grad (tuple of bool): their ``need_grad`` flags, to tell later
            whether this analysis still holds.
    """

    def __init__(self, consumers, counts, functions):
        self.consumers = consumers
        self.counts = counts
        self.reached = tuple(i for i, c in enumerate(counts) if c > 0)
        self.functions = functions
        self.need_grad = need_grad_flags(functions)

    def still_valid(self):
        """Whether the functions still need grad as they did (a parameter
        frozen or unfrozen since changes which functions are called)."""
        return need_grad_flags(self.functions) == self.need_grad


def need_grad_flags(functions):
    return tuple(f.need_grad for f in functions)


def analyze(root, positions):
    """Analyses the backward pass that starts at function `root`.

    Args:
        root (nnabla.function.Function): the first function backward calls
            (the parent of the variable backward was called on).
        positions (dict): gradient ``NdArray`` to its position in the list
            of gradients.

    Returns:
        :obj:`BackwardGraph`
    """
    counts = [0] * len(positions)
    consumers = {}
    functions = []
    stack = [root]
    opened = {root}
    while stack:
        f = stack.pop()
        if not f.need_grad:
            continue
        functions.append(f)
        written = []
        for v in f.inputs:
            parent = v.parent
            if parent is None:
                # A leaf's gradient is written only if it needs one.
                i = positions.get(v.grad) if v.need_grad else None
                if i is not None and i not in written:
                    written.append(i)
            elif parent.need_grad and parent not in opened:
                opened.add(parent)
                stack.append(parent)
        for i in written:
            counts[i] += 1
        consumers[f] = tuple(written)
    return BackwardGraph(consumers, counts, functions)
