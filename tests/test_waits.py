"""No wait for other ranks is unbounded, and a stalled one says who is
missing: a late rank (stall reports), ranks in different calls (found
from the stall reports within seconds), a rank that never comes
(NNCOMM_TIMEOUT: every other rank raises CommunicatorError naming it, then
the job is aborted), Ctrl-C (KeyboardInterrupt within a second), a rank
killed during a callback backward (with mpiexec's clean-up and without:
the others exit non-zero within NNCOMM_TIMEOUT + 5 s), a rank whose
script ends before a call (the others raise CommunicatorError naming it
within seconds; not where it made the call and ended first). After each job, no
process of it is left running. The worker is tests/mpi/waits.py.
"""
import os
import re
import subprocess
import sys
import time
import uuid

import pytest

from launcher import (WORKERS, run_job, run_program, worker_command,
                      worker_env)

MISSING = re.compile(r"world ranks \[(\d+(?:, \d+)*)\] never arrived")


def rank_line(rank, out, err):
    """The line `rank: ...` that world rank `rank` printed on stdout."""
    line = re.search(rf"^rank {rank}: .*$", out, re.MULTILINE)
    assert line is not None, out + err
    return line.group(0)


def left_running(token, grace=5.0):
    """The processes of the job marked `token` still alive `grace` s after
    mpiexec returned (a killed rank may take a moment to go)."""
    deadline = time.monotonic() + grace
    while True:
        found = subprocess.run(["pgrep", "-f", token], capture_output=True,
                               text=True).stdout.split()
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


@pytest.mark.parametrize("op", ["all_reduce", "callback"])
def test_a_stall_is_reported_with_the_missing_rank(op):
    code, out, err, _ = run_job("waits", 3, ["stall", op, "stall"],
                                env={"NNCOMM_STALL_WARNING": "1"}, timeout=90)
    assert code == 0, out + err
    # The results, once the late rank came, are checked too.
    assert re.search(r"^waits: [1-9]\d* checks passed on 3 ranks", out,
                     re.MULTILINE), out
    stalls = [line for line in err.splitlines()
              if line.startswith("nncomm: stalled")]
    # Rank 0 reports the operation and the rank still missing, again while
    # it lasts (3.5 s late, reports from 2 s on, every second).
    assert len(stalls) >= 2, err
    label = "all_reduce of 1 arrays" if op == "all_reduce" else \
        "all_reduce_callback: gradient bucket 1 of"
    for line in stalls:
        assert label in line, line
        assert line.endswith("waiting for world ranks [2]"), line


def timed_out_lines(mode, op):
    """Runs waits.py MODE OP on 3 ranks with NNCOMM_TIMEOUT=3, where ranks 0
    and 1 wait for rank 2 in vain; checks that the job failed in time and
    left no process, and returns the error lines of ranks 0 and 1."""
    token = f"{mode}-{uuid.uuid4().hex}"
    code, out, err, seconds = run_job(
        "waits", 3, [mode, op, token], env={"NNCOMM_TIMEOUT": "3"},
        timeout=60)
    assert code != 0, out
    # 3 s, then the exception and the abort it starts, with room for the
    # start-up of three ranks on two cores.
    assert seconds < 3 + 5 + 15, seconds
    assert not left_running(token)
    return [rank_line(rank, out, err) for rank in (0, 1)]


@pytest.mark.parametrize("op", ["all_reduce", "callback", "barrier", "init",
                                "all_gather"])
def test_a_rank_that_never_comes_times_out_everywhere(op):
    for line in timed_out_lines("timeout", op):
        assert "CommunicatorError" in line, line
        assert "NNCOMM_TIMEOUT" in line, line
        if op != "init":  # the communicator being made has no ranks yet
            assert MISSING.search(line).group(1) == "2", line


@pytest.mark.parametrize("op", ["all_reduce", "callback"])
def test_ctrl_c_interrupts_a_wait_within_a_second(op):
    token = f"interrupt-{uuid.uuid4().hex}"
    code, out, err, _ = run_job("waits", 2, ["interrupt", op, token],
                                timeout=60)
    assert code != 0, out
    took = re.search(r"rank 0: KeyboardInterrupt ([\d.]+) s after SIGINT",
                     out)
    assert took is not None, out + err
    assert float(took.group(1)) < 1.0, took.group(0)
    # The interrupted operation never completes: later ones refuse at once
    # instead of matching the wrong calls, and the job is aborted at exit.
    assert "rank 0: then CommunicatorError: nncomm can no longer " \
           "communicate" in out, out
    assert "is aborting the job" in err, err
    assert not left_running(token)


@pytest.mark.parametrize("op", ["all_reduce", "callback"])
def test_a_rank_whose_script_raises_aborts_the_job(op):
    token = f"raise-{uuid.uuid4().hex}"
    code, out, err, seconds = run_job(
        "waits", 3, ["raise", op, token], env={"NNCOMM_TIMEOUT": "600"},
        timeout=120)
    assert code != 0, out
    # In a hook, nnabla hands the exception on as a SystemError.
    assert re.search(r"is aborting the job: an uncaught \w+Error ended the "
                     r"script on world rank 2", err), err
    assert "the last rank's script fails" in err, err  # its traceback
    assert seconds < 30, seconds
    assert not left_running(token)


@pytest.mark.parametrize("op", ["all_reduce", "callback", "barrier",
                                "communicator", "new_group", "timeline"])
def test_a_rank_whose_script_ends_fails_the_waits_for_it(op):
    token = f"exit-{uuid.uuid4().hex}"
    args = ["exit", op, token]
    # sys.exit(3) as a plain script: mpi4py's runner would abort the job.
    program = worker_command("waits", args) if op != "callback" else \
        [sys.executable, os.path.join(WORKERS, "waits.py"), *args]
    code, out, err, seconds = run_program(
        program, 3, worker_env({"NNCOMM_TIMEOUT": "600"}), timeout=120)
    assert code != 0, out
    for rank in (0, 1):
        line = rank_line(rank, out, err)
        assert "CommunicatorError" in line, line
        assert "the script of world ranks [2] ended without making this " \
               "call" in line, line
        # Named in the message: a barrier by the call that makes it, an
        # agreement by what it agrees on.
        label = {"new_group": "new_group of 3 ranks (",
                 "timeline": "agreeing that a timeline records ("}.get(op, "")
        assert label in line, line
    # A second of waiting, then the abort.
    assert seconds < 30, seconds
    assert not left_running(token)


@pytest.mark.parametrize("op", ["bcast", "reduce"])
def test_a_rank_that_made_the_call_may_end_first(op):
    # Rank 1 ends while the root still waits for the late rank 2.
    code, out, err, _ = run_job("waits", 3, ["finish", op, "finish"],
                                timeout=90)
    assert code == 0, out + err
    for rank in range(3):
        assert f"rank {rank}: finished, right" in out, out + err


@pytest.mark.parametrize("cleanup", [True, False])
def test_a_rank_killed_during_backward_ends_the_job(cleanup):
    token = f"kill-{uuid.uuid4().hex}"
    # Recording off: MPICH's mpiexec, under -disable-auto-cleanup, ends
    # the job at the first output of a survivor once it has reaped the
    # dead rank (strace, 2026-11-26), and with recording on that can be a
    # record's announcement, before the lines read here. test_mpi.py's
    # flight tests show the records of a killed rank's survivors.
    code, out, err, seconds = run_job(
        "waits", 3, ["kill", "callback", token],
        env={"NNCOMM_TIMEOUT": "10", "NNCOMM_FLIGHT_RECORDER": "0"},
        timeout=90,
        mpiexec_args=() if cleanup else ("-disable-auto-cleanup",))
    assert code != 0, out
    assert seconds < 10 + 5 + 15, seconds
    if not cleanup and seconds > 5:
        # mpiexec left the survivors running (it sometimes ends them all
        # anyway): they timed out, named the dead rank and aborted.
        assert MISSING.search(out).group(1) == "2", out + err
    assert not left_running(token)


def test_a_call_async_on_some_ranks_and_blocking_on_others_is_named():
    # Calls on two communicators (the group's, its queue's) wait for each
    # other until NNCOMM_TIMEOUT, as calls on two groups of the same ranks
    # do; the nonblocking side's message says where it waits.
    for line in timed_out_lines("mismatch", "async"):
        assert "NNCOMM_TIMEOUT" in line, line
        assert "in its queue of async_op=True calls" in line, line


@pytest.mark.parametrize("case", ("all_reduce", "large", "sampled",
                                  "skipped", "callback"))
def test_ranks_in_different_calls_find_out(case):
    token = f"mismatch-{uuid.uuid4().hex}"
    code, out, err, seconds = run_job(
        "waits", 3, ["mismatch", case, token], timeout=60)
    assert code != 0, out
    for rank in range(3):
        line = rank_line(rank, out, err)
        assert "make different calls" in line, line
    # Reports go out after a second of waiting; NNCOMM_TIMEOUT is 30 min.
    assert seconds < 30, seconds
    assert not left_running(token)
