# cython: language_level=3, boundscheck=False, wraparound=False
# distutils: language = c++
"""nncomm's compiled core: the communicator over MPI."""

from libnncomm cimport *

include "errors.pxi"
include "arrays.pxi"
include "communicator.pxi"
