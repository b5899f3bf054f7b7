"""nncomm: a distributed-training communicator for nnabla, over MPI.

Change ``import nnabla.communicators as C`` to
``import nncomm.communicators as C``; the rest of a data-parallel nnabla
script stays as it is.

The communicator's names are loaded on first use, so that
``nncomm.packing`` (bucket packing kernels on raw addresses) imports where
nnabla or MPI are not installed.
"""
import importlib

# name -> the module that defines it
_LAZY = {
    "AllReduceCallback": "nncomm._nncomm",
    "Communicator": "nncomm._nncomm",
    "GradientReducer": "nncomm._nncomm",
    "WorkerDescriptor": "nncomm._nncomm",
    "BlockMomentumSolver": "nncomm.block_momentum",
    "BucketHookError": "nncomm.errors",
    "GradBucket": "nncomm._nncomm",
    "Pending": "nncomm._nncomm",
    "DeviceBuffer": "nncomm._nncomm",
    "CommunicatorError": "nncomm.errors",
    "DataParallelError": "nncomm.errors",
    "NonFiniteGradientError": "nncomm.errors",
    "InputsExhaustedError": "nncomm.errors",
    "Join": "nncomm.join",
    "Compression": "nncomm.compression",
    "DistributedSolver": "nncomm.distributed_solver",
    "QuantizedReducer": "nncomm.quantized",
    "allgather_object": "nncomm.broadcast",
    "block_momentum_solver": "nncomm.block_momentum",
    "broadcast_object": "nncomm.broadcast",
    "broadcast_parameters": "nncomm.broadcast",
    "broadcast_solver_state": "nncomm.broadcast",
    "chain_hooks": "nncomm.hooks",
    "consolidate_states": "nncomm.sharded_state",
    "sparse_all_reduce": "nncomm.sparse",
    "communicators": "nncomm.communicators",
    "hooks": "nncomm.hooks",
    "nnabla_types_refused": "nncomm._nncomm",
    "data_parallel_solver": "nncomm.distributed_solver",
}

__all__ = sorted(_LAZY)
__version__ = "0.1.0"


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'nncomm' has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name])
    value = module if module.__name__ == f"{__name__}.{name}" else \
        getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
