"""What tests/test_launcher.py starts through nncomm-run: it needs only
mpi4py (no nnabla), so that each launch takes a second or two.

Usage: launched.py MODE [args ...], where MODE is
- report: each rank prints the sum of the world's ranks (an all-reduce),
  the NNCOMM_* variables it sees and its own arguments;
- exit CODE: every rank exits with CODE;
- raise: rank 1 raises while rank 0 waits in a barrier;
- wait DIR: each rank creates DIR/ready.RANK, then sleeps until a signal
  (SIGINT or SIGTERM), whose name it writes to DIR/got.RANK; once every
  rank has, it exits 128 + the signal's number.
"""
import glob
import os
import signal
import sys
import time

from mpi4py import MPI

MODE, ARGS = sys.argv[1], sys.argv[2:]
WORLD = MPI.COMM_WORLD


def say(line):
    """Prints `line` in one write, so that mpiexec never interleaves it
    with another rank's (print writes the newline apart)."""
    os.write(sys.stdout.fileno(), f"{line}\n".encode())


if MODE == "report":
    total = WORLD.allreduce(WORLD.rank)
    seen = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                    if k.startswith("NNCOMM_"))
    say(f"rank {WORLD.rank} of {WORLD.size}: sum {total}; {seen}; "
        f"args {ARGS}")
elif MODE == "exit":
    sys.exit(int(ARGS[0]))
elif MODE == "raise":
    if WORLD.rank == 1:
        raise RuntimeError("rank 1 fails")
    WORLD.barrier()
elif MODE == "wait":
    def record(signum, frame):
        # Exiting at once could get the other ranks killed by mpiexec
        # before they record theirs.
        with open(os.path.join(ARGS[0], f"got.{WORLD.rank}"), "w") as f:
            f.write(signal.Signals(signum).name)
        deadline = time.monotonic() + 30
        while len(glob.glob(os.path.join(ARGS[0], "got.*"))) < WORLD.size \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        os._exit(128 + signum)

    for each in (signal.SIGINT, signal.SIGTERM):
        signal.signal(each, record)
    open(os.path.join(ARGS[0], f"ready.{WORLD.rank}"), "w").close()
    time.sleep(120)
