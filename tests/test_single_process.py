"""What needs no mpiexec: the factories, their nnabla aliases, the context
check, use before init() and after finalize(), and is_capable. Importing
nncomm initialises MPI as a singleton (one rank), as for a script started
with plain ``python``.
"""
import numpy as np
import pytest
from mpi4py import MPI

import nnabla as nn
from nnabla.ext_utils import get_extension_context

import nncomm
import nncomm.communicators as C

# The names scripts written for nnabla.communicators use, the misspelt one
# included.
FACTORIES = ["MultiProcessDataParallelCommunicator",
             "MultiProcessDataParalellCommunicator",
             "MultiProcessCommunicator", "Comm", "Dist"]


@pytest.mark.parametrize("name", FACTORIES)
def test_factory_makes_a_communicator_from_a_cpu_context(name):
    factory = getattr(C, name)
    for ctx in (get_extension_context("cpu"), nn.Context(),
                get_extension_context("cpu", type_config="half")):
        comm = factory(ctx)
        assert isinstance(comm, nncomm.Communicator)
        assert isinstance(comm.name, str) and comm.name


# The class itself as well: constructed directly, it must not hand device
# addresses to MPI either.
CONSTRUCTORS = {name: getattr(C, name) for name in FACTORIES}
CONSTRUCTORS["nncomm.Communicator"] = nncomm.Communicator


@pytest.mark.parametrize("name", sorted(CONSTRUCTORS))
@pytest.mark.parametrize("backend", [["cudnn:float"], ["cuda:half"],
                                     ["cuda:float", "cpu:float"]])
def test_non_cpu_context_is_refused(name, backend):
    ctx = nn.Context(backend=backend, array_class="CudaCachedArray",
                     device_id="0")
    with pytest.raises(ValueError, match="CPU context") as refused:
        CONSTRUCTORS[name](ctx)
    # This machine has neither nnabla-ext-cuda nor a GPU: both are named.
    assert "computes on CUDA" in str(refused.value)
    assert "nnabla-ext-cuda" in str(refused.value)
    assert "a CUDA GPU (" in str(refused.value)


@pytest.mark.parametrize("name", sorted(CONSTRUCTORS))
def test_missing_context_is_refused(name):
    with pytest.raises(ValueError, match="CPU or CUDA context"):
        CONSTRUCTORS[name](None)


def _uninitialised():
    return C.MultiProcessDataParallelCommunicator(get_extension_context("cpu"))


def _array():
    return nn.NdArray.from_numpy_array(np.arange(3, dtype=np.float32))


USES = {
    "rank": lambda c: c.rank,
    "size": lambda c: c.size,
    "local_rank": lambda c: c.local_rank,
    "barrier": lambda c: c.barrier(),
    "new_group": lambda c: c.new_group(("g", [0])),
    "list_groups": lambda c: c.list_groups(),
    "find_group": lambda c: c.find_group("world"),
    "all_reduce": lambda c: c.all_reduce(_array()),
    "reduce": lambda c: c.reduce([_array()], 0),
    "bcast": lambda c: c.bcast(_array(), 0),
    "all_gather": lambda c: c.all_gather(_array(), [_array()]),
    "reduce_scatter": lambda c: c.reduce_scatter([_array()], _array()),
    "workers": lambda c: c.workers(),
    "current_worker": lambda c: c.current_worker(),
    "is_main": lambda c: c.is_main(),
    "broadcast_object": lambda c: nncomm.broadcast_object(c, 1),
    "allgather_object": lambda c: nncomm.allgather_object(c, 1),
}


@pytest.mark.parametrize("use", sorted(USES))
def test_use_before_init_raises(use):
    with pytest.raises(RuntimeError, match=r"not initialized.*init\(\)"):
        USES[use](_uninitialised())


@pytest.mark.parametrize("use", sorted(USES))
def test_use_after_finalize_raises(use):
    comm = _uninitialised()
    comm.init()
    comm.finalize()
    comm.finalize()  # a second call does nothing
    with pytest.raises(RuntimeError, match="finalized"):
        USES[use](comm)


def test_finalize_before_init_raises_and_init_after_it_too():
    comm = _uninitialised()
    with pytest.raises(RuntimeError, match="not initialized"):
        comm.finalize()
    comm.init()
    comm.finalize()
    with pytest.raises(RuntimeError, match="finalized"):
        comm.init()


def test_is_capable_needs_no_init():
    comm = _uninitialised()
    # This machine has no GPU; MPI runs with MPI_THREAD_MULTIPLE.
    assert comm.is_capable("gpu") is False
    assert comm.is_capable("nccl") is False
    assert comm.is_capable("callback") is True
    assert comm.is_capable("gradient_reducer") is True
    with pytest.raises(ValueError, match="unknown capability 'tpu'.*gpu"):
        comm.is_capable("tpu")


def test_singleton_without_mpiexec():
    """One process started without mpiexec is a world of one rank."""
    comm = _uninitialised()
    comm.init()
    with pytest.raises(RuntimeError, match="already initialized"):
        comm.init()
    assert (comm.rank, comm.size, comm.local_rank) == (0, 1, 0)
    assert comm.list_groups() == {"world": [0]}
    x = nn.NdArray.from_numpy_array(np.array([1.5, -2.0, 4.0], np.float32))
    comm.all_reduce(x, division=True)
    np.testing.assert_array_equal(x.data, [1.5, -2.0, 4.0])
    gathered = nn.NdArray((3,))
    comm.all_gather(x, gathered)
    np.testing.assert_array_equal(gathered.data, [1.5, -2.0, 4.0])
    comm.barrier()
    assert comm.is_main() and comm.workers() == [comm.current_worker()]
    assert comm.current_worker() == nncomm.WorkerDescriptor(
        0, MPI.Get_processor_name())
    assert nncomm.broadcast_object(comm, {"a": None}) == {"a": None}
    assert nncomm.allgather_object(comm, [1, (2,)]) == [[1, (2,)]]


VERSION_CHECK = """
import sys
import numpy as np
import nnabla as nn
import nnabla.functions as F
from nnabla._variable import CommunicatorBackwardCallback
from nnabla.ext_utils import get_extension_context
import nncomm, nncomm.communicators as C
if sys.argv[1] != "as installed":
    nn.__version__ = sys.argv[1]
comm = C.MultiProcessDataParallelCommunicator(get_extension_context("cpu"))
comm.init()
x = nn.Variable.from_numpy_array(np.arange(3, dtype=np.float32),
                                 need_grad=True)
y = F.sum(x * x)
y.forward()
cb = comm.all_reduce_callback([x.grad], 8)
print(isinstance(cb, CommunicatorBackwardCallback),
      isinstance(cb, nncomm.AllReduceCallback))
y.backward(function_post_hook=cb)
print(list(x.g))
x.grad.zero()
try:
    y.backward(communicator_callbacks=cb)
    print("taken", list(x.g))
except TypeError as e:
    print("refused:", e)
try:
    F.sync_batch_normalization(F.reshape(x, (1, 3)), None, None, None, None,
                               comm).forward()
    print("sync_batch_normalization taken")
except TypeError as e:
    print("sync_batch_normalization refused:", e)
print("why not:", nncomm.nnabla_types_refused())
"""


@pytest.mark.parametrize("version", ["as installed", "1.40.0"])
def test_communicator_callbacks_only_with_the_nnabla_it_knows(version):
    """nnabla 1.39.0 (installed here) takes the callback in
    communicator_callbacks= and the communicator in
    F.sync_batch_normalization; for any other version nncomm does not use
    its declarations of nnabla's types: a hook only, and nnabla's
    TypeErrors where nnabla's types are wanted, no crash, and
    nnabla_types_refused() says why."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", VERSION_CHECK, version],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[1] == "[0.0, 2.0, 4.0]"
    if version == "as installed":
        assert lines[0] == "True False"
        assert lines[2] == "taken [0.0, 2.0, 4.0]"
        assert lines[3] == "sync_batch_normalization taken"
        assert lines[4] == "why not:"  # (stripped: nothing to say)
    else:
        assert lines[0] == "False True"
        assert lines[2].startswith("refused:"), lines
        assert lines[3].startswith("sync_batch_normalization refused:")
        assert lines[4] == ("why not: nnabla 1.40.0 is not one nncomm "
                            "knows the types of (1.39.0)")


@pytest.mark.parametrize("name,maker", [
    ("Pending", "async_op=True"),
    ("GradientReducer", "Communicator.gradient_reducer"),
    ("AllReduceCallback", "Communicator.all_reduce_callback")])
def test_objects_nncomm_makes_refuse_direct_construction(name, maker):
    # Made directly they would hold nothing, and crash at their first call.
    with pytest.raises(TypeError, match=f"{name} objects are made by "
                                        f".*{maker}.*not directly"):
        getattr(nncomm, name)()
