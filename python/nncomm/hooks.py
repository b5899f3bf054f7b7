"""Combining function hooks: nnabla's ``backward`` takes one
``function_post_hook``."""


def chain_hooks(*hooks):
    """A hook that calls each of `hooks` in turn (``None`` entries skipped).

    Args:
        *hooks: callables taking an ``nnabla.function.Function``.

    Returns:
        callable: the combined hook.

    Example:

    .. code-block:: python

        cb = comm.all_reduce_callback(grads, 2 << 20, division=True)
        loss.backward(function_post_hook=nncomm.chain_hooks(my_hook, cb))
    """
    active = tuple(h for h in hooks if h is not None)
    for h in active:
        if not callable(h):
            raise TypeError(f"{h!r} is not callable")

    def chained(f):
        for h in active:
            h(f)

    return chained
