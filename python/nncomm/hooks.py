"""Hooks: combining function hooks (nnabla's ``backward`` takes one
``function_post_hook``), and the built-in bucket hooks
(``fp16_compress``, ``bf16_compress``, ``PowerSGD``, from
``nncomm.comm_hooks``) for ``hook=`` of the gradient reductions."""
from nncomm.comm_hooks import PowerSGD, bf16_compress, fp16_compress

__all__ = ["PowerSGD", "bf16_compress", "chain_hooks", "fp16_compress"]


def chain_hooks(*hooks):
    """A hook that calls each of `hooks` in turn (``None`` entries skipped).

    Args:
        *hooks: callables taking an ``nnabla.function.Function``.

    Returns:
        callable: the combined hook. When one of `hooks` raises (which ends
        nnabla's backward), it first tells every hook that has a
        ``backward_raised`` method (nncomm's callbacks), so that they close
        their backward at once instead of leaving the other ranks waiting.

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
        try:
            for h in active:
                h(f)
        except BaseException:
            for h in active:
                raised = getattr(h, "backward_raised", None)
                if raised is not None:
                    raised()
            raise

    return chained
