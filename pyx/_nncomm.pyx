# cython: language_level=3, boundscheck=False, wraparound=False
# distutils: language = c++
"""nncomm's compiled core: the communicator over MPI."""

cimport cython
from cpython.exc cimport PyErr_Fetch
from cpython.pycapsule cimport PyCapsule_GetPointer
from cython.operator cimport dereference as deref
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libcpp cimport bool as cpp_bool
from libcpp.algorithm cimport sort
from libcpp.mutex cimport mutex
from libcpp.utility cimport pair
from mpi4py cimport MPI
from libcore cimport *
from libnncomm cimport *
from libnnabla cimport *
from libpack cimport (PackSegment, PackTable, build_pack_table, pack_host,
                      unpack_host)

import atexit
import collections
import contextlib
import hashlib
import math
import operator
import os
import sys
import threading
import warnings
import zlib

import numpy as np
from mpi4py import MPI

from nncomm import cuda_context, nccl_wheels, packing
from nncomm import timeline as timeline_files
from nncomm.nnabla_adapter.graph import analyze, gradients_written
from nncomm.launched import SeveralRanks, check_joined

try:
    import nnabla as nn
    from nnabla import NdArray, Variable
except ImportError:
    # GPU arrays (gpu_arrays.pxi) need no nnabla: nothing is an NdArray, and
    # there are no parameters to register.
    nn = None

    class NdArray:
        pass

    class Variable:
        pass

include "errors.pxi"
include "dtypes.pxi"
include "waits.pxi"
include "flight_recorder.pxi"
include "nnabla_adapter/ndarrays.pxi"
include "gpu_arrays.pxi"
include "placement.pxi"
include "groups.pxi"
include "join.pxi"
include "job.pxi"
include "collectives.pxi"
include "pending.pxi"
include "engines.pxi"
include "bucket_hooks.pxi"
include "nnabla_adapter/backward_hook.pxi"
include "nnabla_adapter/nnabla_types.pxi"
include "varying_sizes.pxi"
include "timeline.pxi"
include "communicator.pxi"
