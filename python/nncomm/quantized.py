"""The quantized all-reduce: CNTK's 1-bit SGD (Seide et al. 2014) and its
N-bit variant, with error feedback, over a communicator's group.

Each rank encodes its gradients (``bits`` per element and two floats per
column, include/nncomm/compression/quantize.hpp), the ranks exchange the encodings in
one all-gather (sums of codes are not codes), and every rank decodes every
rank's and sums them in rank order, so that all end with the same
gradients, bit for bit.
"""
import numpy as np

import nnabla as nn
from nnabla.ext_utils import get_extension_context

from nncomm import _quantize
from nncomm.broadcast import _agreed
from nncomm.compression import _bits

# A block's state word: 1 a rank that failed (fail()), this one a rank
# whose gradients held a NaN or an infinity, which sends the number of
# those and the first _SHOWN indices instead of its codes.
_NONFINITE = 2
_SHOWN = 8

# The kernels work on host memory: nnabla hands them the gradients there,
# as float32, whatever the communicator's context computes on.
_HOST = get_extension_context("cpu")


class QuantizedReducer:
    """Sums (or averages) a list of gradients over a group of ranks, each
    rank's quantized to `bits` per element, as CNTK's
    ``data_parallel_distributed_learner(num_quantization_bits=...)`` does.

    A gradient of shape (d0, d1, ...) is quantized as a matrix of d0 rows
    and d1 * ... columns (a 1-D gradient is one column), each column on its
    own: at 1 bit, as its elements' signs and the means of its negative
    and non-negative values; at 2 to 8 bits, as 2^bits levels from its min
    to its max. One rank sends, per step, ``bits`` per element, 64 bits
    per column and a 32-bit state word. With `error_feedback`, each rank
    keeps a residual per element (float32, zero at first) that is added to
    the next step's gradient: it is what quantization lost, and sending it
    later is what keeps training converging at 1 bit.

    The encoding runs on the host: gradients are read and written through
    ``data_ptr(np.float32, cpu context)``, so float16 and float64 gradients
    are converted by nnabla and hold float32 afterwards (nnabla casts them
    back where they are read in another type), and on a CUDA context they
    are copied to the host and back. The send and receive buffers are
    int32 NdArrays made once; encoding and decoding release the GIL.

    Making the reducer is collective over the group: the ranks check that
    they pass gradients of the same shapes and the same `bits`,
    `error_feedback` and `division` (one all-gather of a digest).

    Args:
        comm (:obj:`nncomm.Communicator`): An initialized communicator.
        data (list of :obj:`nnabla.NdArray`): The gradients, float.
        bits (int): Bits per element, 1 to 8.
        error_feedback (bool): Keep and send on the quantization error.
        division (bool): Average over the group instead of summing.
        group (str): Name of the communicator's group to reduce over.
        check_finite (bool): Check every gradient for NaN and infinity
            (one vectorised pass) before it is encoded: where one holds
            some, that rank sends the indices instead of its codes and
            :meth:`reduce` raises :class:`nncomm.NonFiniteGradientError`
            on every rank, no gradient changed. ``None`` (default):
            ``NNCOMM_CHECK_FINITE=1`` turns it on.

    Raises:
        ValueError: On every rank, when `bits` is out of range or the ranks
            disagree on shapes or settings (a rank whose `data` is not a
            list of float NdArrays raises TypeError, the others
            ValueError).

    Example:

    .. code-block:: python

        grads = [v.grad for v in nn.get_parameters().values()]
        reducer = nncomm.QuantizedReducer(comm, grads, 1, division=True)
        for x.d, t.d in batches:
            loss.forward()
            solver.zero_grad()
            loss.backward(clear_buffer=True)
            reducer.reduce()
            solver.update()
    """

    def __init__(self, comm, data, bits, error_feedback=True,
                 division=False, group="world", check_finite=None):
        from nncomm._nncomm import check_finite_of
        check_finite = check_finite_of(check_finite)
        def gradients():
            _bits(bits, "bits")
            return [(str(i), x) for i, x in enumerate(_float_ndarrays(data))]
        # str: an int and a numpy integer of one value compare alike.
        settings = {"bits": str(bits), "error_feedback": bool(error_feedback),
                    "division": bool(division), "check_finite": check_finite}
        agreed = _agreed(comm, gradients, group, "QuantizedReducer",
                         "gradients", settings)
        self._comm = comm
        self._group = group
        self._bits = bits
        self._division = bool(division)
        self._world_ranks = comm.find_group(group)
        self._ranks = len(self._world_ranks)
        self._check_finite = check_finite
        self._names = None  # per gradient, its parameter's name
        self._data = [x for _, x in agreed]
        self._matrices = [_quantize.matrix(x.shape) for x in self._data]
        self._residuals = [_zeros(x.shape, np.float32) for x in self._data] \
            if error_feedback else None
        words = _quantize.block_words([(0, 0, *m) for m in self._matrices],
                                      bits)
        self._send = _zeros(words, np.int32)
        self._recv = _zeros(words * self._ranks, np.int32)

    @property
    def residuals(self):
        """list of :obj:`nnabla.NdArray`: This rank's quantization error
        per gradient, float32 (None without error feedback)."""
        return self._residuals

    def reduce(self):
        """One step: encodes this rank's gradients (plus residuals), gathers
        every rank's encoding and writes the decoded sum (or mean) into
        every gradient. Collective over the group.

        Raises:
            TypeError: Here, when a gradient became non-float; the other
                ranks raise RuntimeError, and no gradient is changed.
            ValueError: Here, when a gradient changed size; likewise.
            RuntimeError: Another rank of the group failed this step.
            nncomm.NonFiniteGradientError: With `check_finite`, on every
                rank, when a gradient of some rank held a NaN or an
                infinity; no gradient is changed.
        """
        try:
            tensors = self._tensors()
            bad = [i for i, x in enumerate(self._data)
                   if not np.isfinite(x.data).all()] \
                if self._check_finite else []
            if bad:
                self._send_nonfinite(bad)
            else:
                _quantize.encode(tensors, self._bits,
                                 self._send.data_ptr(np.int32, _HOST))
        except Exception:
            self.fail()
            raise
        self._comm.all_gather(self._send, self._recv, group=self._group)
        if self._check_finite:
            self._raise_nonfinite()
        _quantize.decode_sum(tensors, self._bits,
                             self._recv.data_ptr(np.int32, _HOST),
                             self._ranks, self._division)

    def _name_gradients(self, names):
        """Names the gradients (None where unknown) for the messages of
        NonFiniteGradientError. For DistributedSolver, which knows them."""
        self._names = list(names)

    def _send_nonfinite(self, bad):
        """Marks this rank's block as holding non-finite gradients `bad`
        (indices): its state word, then their number and the first few."""
        words = self._send.data
        shown = bad[:max(0, min(_SHOWN, words.size - 2))]
        words[0] = _NONFINITE
        words[1] = len(bad)
        words[2:2 + len(shown)] = shown

    def _raise_nonfinite(self):
        """Raises NonFiniteGradientError where a rank's block says it held
        non-finite gradients."""
        from nncomm._nncomm import nonfinite_error
        blocks = self._recv.data.reshape(self._ranks, -1)
        found = {}
        for r, block in enumerate(blocks):
            if block[0] == _NONFINITE:
                shown = min(int(block[1]), _SHOWN, block.size - 2)
                found[self._world_ranks[r]] = (
                    int(block[1]), [int(i) for i in block[2:2 + shown]])
        if found:
            raise nonfinite_error(self._data, self._names, found)

    def fail(self):
        """Takes part in this step's exchange as failed, so that the other
        ranks' :meth:`reduce` raises instead of waiting for this rank (a
        backward that raised here, say). Collective over the group."""
        self._send.data[0] = 1
        self._comm.all_gather(self._send, self._recv, group=self._group)

    def _tensors(self):
        """(gradient, residual, rows, cols) per gradient, at their memory
        now."""
        tensors = []
        for i, (x, (rows, cols)) in enumerate(zip(self._data,
                                                  self._matrices)):
            _check_float(i, x, "became")
            if x.size != rows * cols:
                raise ValueError(f"data[{i}] has {x.size} elements, "
                                 f"{rows * cols} when the reducer was made")
            residual = 0 if self._residuals is None else \
                self._residuals[i].data_ptr(np.float32, _HOST)
            tensors.append((x.data_ptr(np.float32, _HOST), residual, rows,
                            cols))
        return tensors


def _float_ndarrays(data):
    if not isinstance(data, (list, tuple)):
        raise TypeError(f"data must be a list of NdArrays, not "
                        f"{type(data).__name__}")
    for i, x in enumerate(data):
        if not isinstance(x, nn.NdArray):
            raise TypeError(f"data[{i}] is a {type(x).__name__}, not an "
                            f"nnabla NdArray (pass a Variable's .grad)")
        _check_float(i, x, "is")
    return list(data)


def _check_float(i, x, verb):
    try:
        dtype = np.dtype(x.dtype)
    except RuntimeError:
        return  # never written yet: it will hold nnabla's default, float32
    if dtype.kind != "f":
        raise TypeError(f"data[{i}] {verb} {dtype}; quantized gradients "
                        f"must be float")


def _zeros(shape, dtype):
    return nn.NdArray.from_numpy_array(np.zeros(shape, dtype))
