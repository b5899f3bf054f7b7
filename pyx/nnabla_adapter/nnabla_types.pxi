# nncomm behind nnabla's own types, where nnabla's C++ takes nothing else:
#
# - what all_reduce_callback returns is an nnabla CommunicatorBackwardCallback
#   (backward(communicator_callbacks=...)) whose C++ callback hands each
#   function, as nnabla's Python Function, and the end of backward to an
#   AllReduceCallback; it is callable as function_post_hook= too;
# - an nnabla Communicator stands for an nncomm one in
#   F.sync_batch_normalization: its C++ communicator hands the
#   find_group and all_reduce calls of nnabla's SyncBatchNormalization to the
#   nncomm communicator, as nnabla NdArrays.
#
# The C++ types are declared in nnabla_abi.hpp from nnabla 1.39's sources;
# the first use checks nnabla's version, the Python objects' sizes, the two
# vtables nncomm calls through, Function's hash and the functions of
# libnnabla.so that read an NdArray (nnabla_arrays.hpp). With any other
# nnabla, nothing here is used: all_reduce_callback returns the plain
# AllReduceCallback, counting in C++ but reading every gradient through
# Python, and F.sync_batch_normalization is left as nnabla has it.


# The nnabla versions nnabla_abi.hpp was written for.
_NNABLA_ABI_VERSIONS = ("1.39.0",)

cdef object _nnabla_types = None  # _NnablaTypes once checked; False if none
cdef str _nnabla_refused = ""     # why not, where not
cdef const FunctionVtable *_functions = NULL
cdef const NdArrayVtable *_ndarrays = NULL
cdef NdArrayCalls _ndarray_calls  # resolved by _check_nnabla


class _NoAbi(Exception):
    pass


class _NnablaTypes:
    """The two stand-ins, made once nnabla's types were checked."""

    def __init__(self, callback, communicator):
        self.callback, self.communicator = callback, communicator


cdef object nnabla_types():
    """_NnablaTypes, made the first time; None where nnabla is missing or
    not a version nncomm knows the layouts of (_nnabla_refused says
    which)."""
    global _nnabla_types, _nnabla_refused
    if _nnabla_types is None:
        _nnabla_types = False
        try:
            _nnabla_types = _check_nnabla()
        except _NoAbi as e:
            _nnabla_refused = str(e)
        except Exception as e:  # nnabla not as its 1.39 sources say
            _nnabla_refused = f"checking nnabla's types raised {e!r}"
    return _nnabla_types or None


cdef const void *_vtable(kind) except NULL:
    capsule = kind.__dict__.get("__pyx_vtable__")
    if capsule is None:
        raise _NoAbi(f"nnabla's {kind.__name__} has no vtable")
    return PyCapsule_GetPointer(capsule, NULL)


cdef object _check_nnabla():
    global _functions, _ndarrays
    if nn is None:
        raise _NoAbi("nnabla is not installed")
    if nn.__version__ not in _NNABLA_ABI_VERSIONS:
        raise _NoAbi(f"nnabla {nn.__version__} is not one nncomm knows the "
                     f"types of ({', '.join(_NNABLA_ABI_VERSIONS)})")
    from nnabla._variable import CommunicatorBackwardCallback
    from nnabla.communicator import Communicator as NnablaCommunicator
    from nnabla.function import Function
    import nnabla.functions as F
    for kind, size in ((CommunicatorBackwardCallback, kCallbackObjectSize),
                       (Function, kFunctionObjectSize),
                       (NdArray, kNdArrayObjectSize),
                       (NnablaCommunicator, kCommunicatorObjectSize)):
        if kind.__basicsize__ != size:
            raise _NoAbi(f"nnabla's {kind.__name__} is not laid out as "
                         f"nncomm declares it")
    from nnabla.ext_utils import get_extension_context
    functions = <const FunctionVtable *>_vtable(Function)
    arrays = <const NdArrayVtable *>_vtable(NdArray)
    # The vtables' slots, tried: each must give back what it is handed (in
    # a CPU context: the default may be any, or unset).
    cpu = get_extension_context("cpu")
    with nn.context_scope(cpu):
        f = F.identity(nn.Variable((1,))).parent
    again = functions.create_from_c((<FunctionObject *><PyObject *>f).fun)
    # (not ==: nnabla's Function.__ne__ raises AttributeError)
    if type(again) is not Function or not again == f or \
            again.name != f.name:
        raise _NoAbi("nnabla's Function.create_from_c is not where nncomm "
                     "declares it")
    if key_of(f) != function_key(<PyObject *>f):
        raise _NoAbi("nnabla's Function.__hash__ is not its graph node's "
                     "address")
    a = NdArray((2,))
    b = arrays.create((<NdArrayObject *><PyObject *>a).arr)
    if type(b) is not NdArray or b.data_ptr(np.float32, cpu) != \
            a.data_ptr(np.float32, cpu):
        raise _NoAbi("nnabla's NdArray.create is not where nncomm declares "
                     "it")
    _check_ndarray_calls(cpu)
    _functions, _ndarrays = functions, arrays
    return _NnablaTypes(_callback_class(CommunicatorBackwardCallback),
                        _communicator_class(NnablaCommunicator))


cdef int _check_ndarray_calls(cpu) except -1:
    """Resolves the functions of libnnabla.so that read an NdArray, and
    checks what they read against nnabla's Python API."""
    cdef string error
    library = os.path.join(os.path.dirname(nn.__file__), "libnnabla.so")
    if not _ndarray_calls.resolve(library.encode(), &error):
        raise _NoAbi(error.decode())
    cdef Context context = as_context(cpu)
    cdef long count
    cdef int type
    cdef cpp_bool zeroed
    cdef void* ptr
    cdef void* ndarray
    zero = NdArray((4,))
    zero.zero()
    for x in (NdArray((3,)), zero,
              NdArray.from_numpy_array(np.ones(5, np.float16)),
              NdArray.from_numpy_array(np.ones(2, np.int64))):
        ndarray = ndarray_of(<PyObject *>x)
        dt = dtype_of(x)
        ptr = NULL
        if not _ndarray_calls.head(ndarray, &count, &type, &zeroed) or \
                count != x.size or zeroed != x.zeroing or \
                ndarray_dtype_code(type) != _DTYPE_CODES[dt] or \
                not _ndarray_calls.memory(ndarray, type, context, False,
                                          &ptr) or \
                <uintptr_t>ptr != x.data_ptr(dt, cpu):
            raise _NoAbi("libnnabla.so's NdArray functions do not read "
                         "what nnabla's Python API does")
    return 0


cdef const NdArrayCalls* ndarray_calls():
    """libnnabla's functions that read an NdArray; NULL where nncomm does
    not know nnabla's types."""
    return &_ndarray_calls if nnabla_types() is not None else NULL


cdef shared_ptr[BackwardCounts] backward_counts(list grads,
                                                NnablaContext context):
    """The C++ counts of callbacks over NdArrays `grads` of `context`:
    reading the gradients there where nncomm knows nnabla's types, handing
    every gradient to Python otherwise."""
    cdef vector[void*] arrays
    if context.calls != NULL:
        for x in grads:
            arrays.push_back(ndarray_of(<PyObject *>x))
    return shared_ptr[BackwardCounts](
        new BackwardCounts(context.calls, arrays, context.cpp))


# -- communicator_callbacks= --------------------------------------------------

cdef int _function_done(PyObject *owner, PyObject *function) except -1:
    (<object>owner)(<object>function)
    return 0


cdef int _backward_done(PyObject *owner) except -1:
    (<AllReduceCallback>owner)._backward_returned()
    return 0


def _callback_class(base):
    class CommunicatorCallback(base):
        """What :meth:`Communicator.all_reduce_callback` returns: nnabla's
        own callback type, for ``backward(communicator_callbacks=cb)``
        (alone or in a list), and callable, for
        ``backward(function_post_hook=cb)``; either way it all-reduces the
        gradients during backward. Its other attributes are its
        :obj:`AllReduceCallback`'s.
        """

        def __init__(self, reducer):
            self._reducer = reducer

        def __call__(self, f):
            return self._reducer(f)

        def __getattr__(self, name):
            return getattr(self._reducer, name)

        def __repr__(self):
            return f"<CommunicatorCallback of {self._reducer!r}>"

    CommunicatorCallback.__module__ = "nncomm"
    CommunicatorCallback.__qualname__ = "CommunicatorCallback"
    return CommunicatorCallback


cdef object as_nnabla_callback(AllReduceCallback reducer):
    """`reducer` as nnabla's backward takes it, where it can; else itself."""
    types = nnabla_types()
    if types is None:
        return reducer
    cb = types.callback(reducer)
    attach(<PyObject *>cb, <PyObject *>reducer, reducer.state.counts,
           _functions, _function_done, _backward_done)
    return cb


# -- sync batch normalization ----------------------------------------------

cdef int _find_group(PyObject *comm, const string &group,
                     vector[int] *ranks) except -1:
    name = group.decode()
    with _FromInsideBackward():
        found = (<object>comm).find_group(name)
    # nnabla's own returns [] for an unknown group, and its
    # SyncBatchNormalization then divides by zero.
    if not found:
        raise ValueError(f"sync_batch_normalization: unknown group "
                         f"{name!r}; groups: "
                         f"{sorted((<object>comm).list_groups())}")
    ranks[0] = found
    return 0


cdef int _all_reduce(PyObject *comm, PyObject *arrays, cpp_bool division,
                     cpp_bool inplace, const string &group) except -1:
    # Sync batch normalization's backward runs inside backward, beside an
    # all_reduce_callback's engine, which has a communicator of its own.
    with _FromInsideBackward():
        _all_reduce_statistics(<object>comm, <list>arrays, division, inplace,
                               group.decode())
    return 0


cdef int _all_reduce_statistics(comm, list arrays, bint division,
                                bint inplace, str group) except -1:
    """Sync batch normalization's all_reduce of per-rank statistics, which
    nnabla then divides by the group's size. Inside comm.join(), a count of
    the ranks still training travels with them (ranks that left add zeros
    to both), and the sums are scaled so that only those count."""
    if not joining():
        comm.all_reduce(arrays, division=division, inplace=inplace,
                        group=group)
        return 0
    from nnabla import NdArray
    counted = NdArray.from_numpy_array(np.ones(1, np.float32))
    comm.all_reduce(arrays + [counted], group=group)
    training = int(round(float(counted.data[0])))
    factor = (1.0 if division else len(comm.find_group(group))) / training
    if factor != 1:
        for x in arrays:
            x.data *= factor
    return 0


def _communicator_class(base):
    public = [name for name in dir(base) if not name.startswith("_")]

    class NnablaCommunicator(base):
        """An nnabla Communicator standing for an nncomm one, for nnabla's
        functions that take nothing else (``F.sync_batch_normalization``):
        every attribute is the nncomm communicator's."""

        def __init__(self, comm):
            self._comm = comm

        def __repr__(self):
            return f"<nnabla Communicator for {self._comm!r}>"

    def forwarded(name):
        return property(lambda self: getattr(self._comm, name))

    # Python-level, every name of nnabla's type is the nncomm
    # communicator's, so that none of nnabla's methods reaches the C++
    # stand-in, which serves sync batch normalization only.
    for name in public:
        setattr(NnablaCommunicator, name, forwarded(name))
    NnablaCommunicator.__module__ = "nncomm"
    return NnablaCommunicator


cdef object as_nnabla_communicator(comm):
    """`comm` (an nncomm Communicator) as an nnabla Communicator, for
    nnabla's functions; None where nncomm does not know nnabla's types."""
    types = nnabla_types()
    if types is None:
        return None
    proxy = types.communicator(comm)
    attach_communicator(<PyObject *>proxy, <PyObject *>comm, _ndarrays,
                        _find_group, _all_reduce)
    return proxy


cdef object _nnabla_sync_batch_normalization = None


def _sync_batch_normalization(x, beta, gamma, mean, variance, comm, *args,
                              **kwargs):
    if isinstance(comm, Communicator):
        proxy = as_nnabla_communicator(comm)
        if proxy is not None:
            comm = proxy
    return _nnabla_sync_batch_normalization(x, beta, gamma, mean, variance,
                                            comm, *args, **kwargs)


cdef int take_sync_batch_normalization() except -1:
    """Makes nnabla's sync batch normalization (F.sync_batch_normalization
    and PF's, which import it from nnabla.function_bases when called) take
    nncomm's communicator, where nncomm knows nnabla's types."""
    global _nnabla_sync_batch_normalization
    if _nnabla_sync_batch_normalization is not None or \
            nnabla_types() is None:
        return 0
    import nnabla.function_bases as bases
    _nnabla_sync_batch_normalization = bases.sync_batch_normalization
    bases.sync_batch_normalization = _sync_batch_normalization
    return 0


def nnabla_types_refused():
    """Why nncomm does not stand behind nnabla's own types (nnabla missing,
    another version, other layouts): a sentence, or "" where it does.
    Checks them if that was not done yet."""
    nnabla_types()
    return _nnabla_refused
