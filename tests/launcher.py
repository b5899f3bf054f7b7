"""Launches the MPI workers in tests/mpi under mpiexec.

The workers run with ``python -m mpi4py``, whose runner aborts every rank as
soon as one raises, so a failing rank ends the job instead of leaving the
others blocked in a collective. A job that still hangs is killed after a
timeout and reported with everything it printed.
"""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(TESTS, "mpi")
# The PyPI mpich wheel puts mpiexec beside the interpreter; a launcher of
# another MPI would not start ranks that mpi4py (built for MPICH) can join.
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")

RANK_COUNTS = (1, 2, 3, 4)


def worker_env(env=None):
    """The environment a worker's ranks add to this one's: its folder on
    PYTHONPATH, then `env`."""
    full_env = {"PYTHONPATH": os.pathsep.join(
        [WORKERS] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    full_env.update(env or {})
    return full_env


def run_job(worker, n, args=(), env=None, timeout=180, mpiexec_args=(),
            last_rank_prefix=()):
    """Runs tests/mpi/<worker>.py on `n` ranks, whatever its outcome.

    Returns (exit code, stdout, stderr, seconds); a job still running after
    `timeout` seconds is killed with every process it started, and fails
    the test. `last_rank_prefix`: a command that starts the last rank's
    (e.g. a shell that outlives it).
    """
    return run_program(worker_command(worker, args), n, worker_env(env),
                       timeout, mpiexec_args, last_rank_prefix)


def worker_command(worker, args=()):
    """The command that runs tests/mpi/<worker>.py on a rank."""
    return [sys.executable, "-m", "mpi4py",
            os.path.join(WORKERS, f"{worker}.py"), *map(str, args)]


def run_program(program, n, env=None, timeout=180, mpiexec_args=(),
                last_rank_prefix=()):
    """Runs the command `program` on `n` ranks under mpiexec, whatever its
    outcome; returns as run_job does."""
    if not os.path.exists(MPIEXEC):
        pytest.fail(f"no mpiexec beside {sys.executable}; install the "
                    f"'mpich' wheel into this environment")
    program = [str(word) for word in program]
    if last_rank_prefix:  # MPMD: the first n-1 ranks, then the last
        ranks = [str(n - 1), *program, ":", "-n", "1", *last_rank_prefix,
                 *program]
    else:
        ranks = [str(n), *program]
    cmd = [MPIEXEC, *mpiexec_args, "-n", *ranks]
    full_env = dict(os.environ)
    # nnabla's CPU kernels are not what is tested; keep 4 ranks on 2 cores
    # from also fighting over OpenMP threads.
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.update(env or {})
    return run_command(cmd, full_env, timeout)


def run_command(cmd, env, timeout=180):
    """Runs `cmd` (a job launcher) with exactly the environment `env`,
    whatever its outcome; returns as run_job does."""
    # A session of its own, so that a hung job can be killed with every
    # rank it started.
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} hung for {timeout} s and was killed\n"
                    f"--- stdout ---\n{out}\n--- stderr ---\n{err}")
    return proc.returncode, out, err, time.monotonic() - start


def run_worker(worker, n, args=(), env=None, timeout=180):
    """Runs tests/mpi/<worker>.py on `n` ranks; fails the test unless the job
    exits 0 and the worker's rank 0 reports its checks as passed.

    Returns the job's stdout.
    """
    code, out, err, _ = run_job(worker, n, args, env, timeout)
    return passed(worker, n, code, out, err)


def passed(worker, n, code, out, err):
    """Fails the test unless the job of `worker` on `n` ranks exited 0
    (`code`) and its rank 0 reported its checks as passed; returns `out`."""
    if code != 0:
        pytest.fail(f"{worker} on {n} ranks exited with {code}\n"
                    f"--- stdout ---\n{out}\n--- stderr ---\n{err}")
    # Guards against a worker that exits 0 without running its checks.
    report = re.search(rf"^{re.escape(worker)}: (\d+) checks passed on "
                       rf"(\d+) ranks", out, re.MULTILINE)
    if report is None or int(report.group(1)) == 0 \
            or int(report.group(2)) != n:
        pytest.fail(f"{worker} on {n} ranks did not report its checks as "
                    f"passed\n--- stdout ---\n{out}\n--- stderr ---\n{err}")
    return out
