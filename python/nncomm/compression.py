"""Compression: how gradients travel, as Horovod's ``hvd.Compression``
names it (a 16-bit wire dtype) and as CNTK quantizes them (1 to 8 bits per
element, with error feedback)."""
import numbers

from nncomm._quantize import MAX_BITS, MIN_BITS


class _WireDtype:
    """Buckets travel in `wire_dtype` (None: the context's), converted while
    they are packed and back while they are unpacked, so compression costs
    no pass of its own; each gradient gets the result in its own dtype."""

    def __init__(self, name, wire_dtype):
        self.name = name
        self.wire_dtype = wire_dtype

    def __repr__(self):
        return f"nncomm.Compression.{self.name}"


class _Quantized:
    """Each rank's gradients quantized to `bits` per element, exchanged in
    one all-gather after backward and summed once decoded
    (:class:`nncomm.quantized.QuantizedReducer`)."""

    def __init__(self, bits, error_feedback):
        self.bits = _bits(bits, "bits")
        self.error_feedback = bool(error_feedback)

    def __repr__(self):
        feedback = "" if self.error_feedback else ", error_feedback=False"
        return f"nncomm.Compression.quantized({self.bits}{feedback})"


def _is_int(x):
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _bits(bits, what):
    """`bits` as an int from 1 to 8; ValueError naming `what` otherwise."""
    if not _is_int(bits) or not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"{what} must be an int from {MIN_BITS} to "
                         f"{MAX_BITS}, not {bits!r}")
    return int(bits)


class Compression:
    """How :class:`nncomm.DistributedSolver` sends gradients.

    - ``Compression.none``: in the context's dtype (float32 for
      ``cpu:float``, float16 for ``type_config="half"``);
    - ``Compression.fp16``: in float16, half the bytes;
    - ``Compression.bf16``: in bfloat16, half the bytes with float32's range;
    - ``Compression.quantized(bits, error_feedback=True)``: CNTK's quantized
      gradients, `bits` per element.

    Example:

    .. code-block:: python

        solver = nncomm.DistributedSolver(S.Sgd(0.1), comm,
                                          compression=nncomm.Compression.fp16)
    """
    none = _WireDtype("none", None)
    fp16 = _WireDtype("fp16", "float16")
    bf16 = _WireDtype("bf16", "bfloat16")

    @staticmethod
    def quantized(bits, error_feedback=True):
        """CNTK's quantized gradients (1-bit SGD, Seide et al. 2014, and its
        N-bit variant): after backward, each column of each rank's
        gradients (a gradient of shape (d0, ...) has d0 rows) travels as
        `bits` per element plus two floats, in one all-gather; every rank
        decodes every rank's and sums them. With `error_feedback`, what
        quantization lost is added to the next step's gradient, which is
        what keeps training converging at 1 bit.

        Args:
            bits (int): Bits per element, 1 to 8. 1: the sign, sent as the
                means of a column's negative and non-negative values; more:
                2^bits levels from the column's min to its max.
            error_feedback (bool): Keep each rank's quantization error
                (one float32 per gradient element) and add it to the next
                step's gradient.

        Returns:
            The compression, for ``DistributedSolver(compression=...)``.

        Raises:
            ValueError: `bits` is not an int from 1 to 8.

        Example:

        .. code-block:: python

            solver = nncomm.DistributedSolver(
                S.Momentum(0.05, 0.9), comm,
                compression=nncomm.Compression.quantized(1))
        """
        return _Quantized(bits, error_feedback)
