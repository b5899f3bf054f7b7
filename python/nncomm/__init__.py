"""nncomm: a distributed-training communicator for nnabla, over MPI.

Change ``import nnabla.communicators as C`` to
``import nncomm.communicators as C``; the rest of a data-parallel nnabla
script stays as it is.
"""
from nncomm import communicators
from nncomm._nncomm import AllReduceCallback, Communicator
from nncomm.hooks import chain_hooks

__all__ = ["AllReduceCallback", "Communicator", "chain_hooks", "communicators"]
__version__ = "0.1.0"
