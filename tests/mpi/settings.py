"""init() refuses settings that do not parse, and settings that change the
MPI calls when the ranks differ in them, naming the variable (and the
ranks' values): a ValueError on a single rank, on several a
DataParallelError (which passes through `except Exception` wrappers) on
every rank, the ValueError its cause.

Usage: settings.py MODE, where MODE is
- bad: every rank runs with NNCOMM_CHUNK_BYTES=4k, NNCOMM_TIMEOUT=-1,
  NNCOMM_GPU_TRANSPORT=gloo, NNCOMM_FLIGHT_RECORDER=lots,
  NNCOMM_CHECK_FINITE=yes, NNCOMM_HIERARCHICAL=sometimes,
  NNCOMM_IPC_MIN_BYTES=-1 and NNCOMM_IPC_BUCKET_BYTES=32MiB;
- differ: rank r runs with NNCOMM_DIRECT_BYTES=(r + 1) * 64, or with
  NNCOMM_CHECK_CALLS=0 on rank 0 only (MODE differ_checks), or with
  NNCOMM_HIERARCHICAL=0 on rank 0 only (MODE differ_hierarchical: on
  ranks that span hosts, the others' world all-reduce would run in two
  levels), or with NNCOMM_IPC_MIN_BYTES=0 on rank 0 only (MODE
  differ_gpu: the ranks would take different GPU transports for an
  operation);
- same: every rank runs with NNCOMM_DIRECT_BYTES=64 (init succeeds).
"""
import os
import sys

from mpi4py import MPI

from _harness import Checker, make_comm
from nncomm.errors import DataParallelError

MODE = sys.argv[1]
RANK, SIZE = MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size
# Read by nncomm once, at init(): set before it, on this rank alone.
if MODE == "bad":
    os.environ["NNCOMM_CHUNK_BYTES"] = "4k"
    os.environ["NNCOMM_TIMEOUT"] = "-1"
    os.environ["NNCOMM_GPU_TRANSPORT"] = "gloo"
    os.environ["NNCOMM_FLIGHT_RECORDER"] = "lots"
    os.environ["NNCOMM_CHECK_FINITE"] = "yes"
    os.environ["NNCOMM_HIERARCHICAL"] = "sometimes"
    os.environ["NNCOMM_IPC_MIN_BYTES"] = "-1"
    os.environ["NNCOMM_IPC_BUCKET_BYTES"] = "32MiB"
elif MODE == "differ":
    os.environ["NNCOMM_DIRECT_BYTES"] = str((RANK + 1) * 64)
elif MODE == "differ_checks" and RANK == 0:
    os.environ["NNCOMM_CHECK_CALLS"] = "0"
elif MODE == "differ_gpu" and RANK == 0:
    os.environ["NNCOMM_IPC_MIN_BYTES"] = "0"
elif MODE == "differ_hierarchical" and RANK == 0:
    os.environ["NNCOMM_HIERARCHICAL"] = "0"
elif MODE == "same":
    os.environ["NNCOMM_DIRECT_BYTES"] = "64"

ck = Checker("settings")
expected = {
    "bad": ["NNCOMM_CHUNK_BYTES=4k", "NNCOMM_TIMEOUT=-1",
            "NNCOMM_GPU_TRANSPORT=gloo (expected auto, nccl, ipc or mpi)",
            "NNCOMM_FLIGHT_RECORDER=lots (expected 0 (off) to 1000000 "
            "operations)",
            "NNCOMM_CHECK_FINITE=yes (expected 0 or 1)",
            "NNCOMM_HIERARCHICAL=sometimes (expected auto, 0 or 1)",
            "NNCOMM_IPC_MIN_BYTES=-1", "NNCOMM_IPC_BUCKET_BYTES=32MiB"],
    "differ": ["NNCOMM_DIRECT_BYTES differs between ranks"]
    + [f"{(r + 1) * 64} on ranks [{r}]" for r in range(SIZE)],
    "differ_checks": ["NNCOMM_CHECK_CALLS differs between ranks",
                      "on ranks [0]"],
    "differ_hierarchical": ["NNCOMM_HIERARCHICAL differs between ranks",
                            "on ranks [0]"],
    "differ_gpu": ["NNCOMM_IPC_MIN_BYTES differs between ranks",
                   "0 on ranks [0]"],
}.get(MODE)
if expected is None:
    comm, _ = make_comm()
    ck.equal(comm.size, SIZE, "init() with the same settings everywhere")
else:
    kind = ValueError if SIZE == 1 else DataParallelError
    if kind is DataParallelError:
        expected.append("ValueError")   # the cause, named
    for text in expected:
        ck.raises(kind, text, f"init() with settings {MODE}: {text}",
                  make_comm)
ck.finish()
