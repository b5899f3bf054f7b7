# What all_reduce_callback returns where nnabla's backward can take it in
# communicator_callbacks=: an nnabla CommunicatorBackwardCallback whose C++
# callback (nnabla_abi.hpp) hands each function, as nnabla's Python
# Function, and the end of backward to an AllReduceCallback; also callable
# as function_post_hook=. Only with an nnabla whose layouts nnabla_abi.hpp
# declares, checked once: anything else gets the plain AllReduceCallback.

from cpython.pycapsule cimport PyCapsule_GetPointer

# The nnabla versions nnabla_abi.hpp was written for.
_NNABLA_ABI_VERSIONS = ("1.39.0",)

cdef object _callback_type = None  # the class, once checked; False if none
cdef str _callback_refused = ""    # why not, where not
cdef const FunctionVtable *_functions = NULL


cdef int _function_done(PyObject *owner, PyObject *function) except -1:
    (<object>owner)(<object>function)
    return 0


cdef int _backward_done(PyObject *owner) except -1:
    (<AllReduceCallback>owner).backward_done()
    return 0


cdef object nnabla_callback_type():
    """The class of the callbacks that nnabla's backward takes, made the
    first time; None where nnabla is missing or not a version nncomm knows
    the layouts of (_callback_refused says which)."""
    global _callback_type, _callback_refused, _functions
    if _callback_type is None:
        _callback_type = False
        try:
            _callback_type = _make_callback_type()
        except _NoAbi as e:
            _callback_refused = str(e)
    return _callback_type or None


class _NoAbi(Exception):
    pass


cdef object _make_callback_type():
    global _functions
    if nn is None:
        raise _NoAbi("nnabla is not installed")
    if nn.__version__ not in _NNABLA_ABI_VERSIONS:
        raise _NoAbi(f"nnabla {nn.__version__} is not one nncomm knows the "
                     f"types of ({', '.join(_NNABLA_ABI_VERSIONS)})")
    from nnabla._variable import CommunicatorBackwardCallback
    from nnabla.function import Function
    import nnabla.functions as F
    if CommunicatorBackwardCallback.__basicsize__ != kCallbackObjectSize or \
            Function.__basicsize__ != kFunctionObjectSize:
        raise _NoAbi("nnabla's CommunicatorBackwardCallback or Function is "
                     "not laid out as nncomm declares them")
    capsule = Function.__dict__.get("__pyx_vtable__")
    if capsule is None:
        raise _NoAbi("nnabla's Function has no vtable")
    functions = <const FunctionVtable *>PyCapsule_GetPointer(capsule, NULL)
    # The vtable's slot, tried on a graph node: it must give back the same
    # node's Function.
    f = F.identity(nn.Variable((1,))).parent
    again = functions.create_from_c((<FunctionObject *><PyObject *>f).fun)
    # (not ==: nnabla's Function.__ne__ raises AttributeError)
    if type(again) is not Function or not again == f or \
            again.name != f.name:
        raise _NoAbi("nnabla's Function.create_from_c is not where nncomm "
                     "declares it")
    _functions = functions

    class CommunicatorCallback(CommunicatorBackwardCallback):
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
    return CommunicatorCallback


cdef object as_nnabla_callback(AllReduceCallback reducer):
    """`reducer` as nnabla's backward takes it, where it can; else itself."""
    kind = nnabla_callback_type()
    if kind is None:
        return reducer
    cb = kind(reducer)
    attach(<PyObject *>cb, <PyObject *>reducer, _functions, _function_done,
           _backward_done)
    return cb
