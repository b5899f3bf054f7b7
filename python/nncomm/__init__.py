"""nncomm: a distributed-training communicator for nnabla, over MPI.

Change ``import nnabla.communicators as C`` to
``import nncomm.communicators as C``; the rest of a data-parallel nnabla
script stays as it is.
"""
from nncomm import communicators
from nncomm._nncomm import Communicator

__all__ = ["Communicator", "communicators"]
__version__ = "0.1.0"
