"""Compression: the dtype gradients travel in, as Horovod's
``hvd.Compression`` names it."""


class _WireDtype:
    """Buckets travel in `wire_dtype` (None: the context's), converted while
    they are packed and back while they are unpacked, so compression costs
    no pass of its own; each gradient gets the result in its own dtype."""

    def __init__(self, name, wire_dtype):
        self.name = name
        self.wire_dtype = wire_dtype

    def __repr__(self):
        return f"nncomm.Compression.{self.name}"


class Compression:
    """How :class:`nncomm.DistributedSolver` sends gradients.

    - ``Compression.none``: in the context's dtype (float32 for
      ``cpu:float``, float16 for ``type_config="half"``);
    - ``Compression.fp16``: in float16, half the bytes;
    - ``Compression.bf16``: in bfloat16, half the bytes with float32's range.

    Example:

    .. code-block:: python

        solver = nncomm.DistributedSolver(S.Sgd(0.1), comm,
                                          compression=nncomm.Compression.fp16)
    """
    none = _WireDtype("none", None)
    fp16 = _WireDtype("fp16", "float16")
    bf16 = _WireDtype("bf16", "bfloat16")
