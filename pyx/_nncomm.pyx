# cython: language_level=3, boundscheck=False, wraparound=False
# distutils: language = c++
"""nncomm's compiled core: the communicator over MPI."""

from cython.operator cimport dereference as deref
from libc.stdint cimport int64_t, uint64_t
from libcpp cimport bool as cpp_bool
from libcpp.mutex cimport mutex
from mpi4py cimport MPI
from libcore cimport *
from libnncomm cimport *
from libnnabla cimport *

import operator
import warnings

from mpi4py import MPI

from nncomm.launched import SeveralRanks, check_joined

include "errors.pxi"
include "dtypes.pxi"
include "process.pxi"
include "arrays.pxi"
include "gpu_arrays.pxi"
include "placement.pxi"
include "groups.pxi"
include "engines.pxi"
include "callback.pxi"
include "nnabla_types.pxi"
include "varying.pxi"
include "timeline.pxi"
include "communicator.pxi"
