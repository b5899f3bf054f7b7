"""The two-level all-reduce (NNCOMM_HIERARCHICAL) on two emulated hosts of
two ranks each (bench/run_two_hosts.sh: two network namespaces joined by
a shaped veth pair, which MPICH sees as two nodes), and its settings.

The emulation needs root or unprivileged user namespaces; where neither
is there the tests that need it are skipped, saying why.
"""
import functools
import os
import re
import subprocess
import uuid

import pytest

from launcher import (MPIEXEC, passed, run_command, run_worker,
                      worker_command, worker_env)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWO_HOSTS = os.path.join(REPO, "bench", "run_two_hosts.sh")
# Printed once per process by a group of uneven hosts under
# NNCOMM_HIERARCHICAL=1 (the worker's group "gapped").
UNEVEN_NOTE = "hosts of a group hold different numbers of its ranks"


@functools.lru_cache(maxsize=None)
def two_hosts_missing():
    """Why two hosts cannot be emulated here, or "" where they can."""
    try:
        done = subprocess.run([TWO_HOSTS, "true"], capture_output=True,
                              text=True, timeout=60,
                              env=dict(os.environ, MPIEXEC=MPIEXEC,
                                       TIMEOUT="50"))
    except subprocess.TimeoutExpired:
        return "bench/run_two_hosts.sh true hung"
    if done.returncode != 0:
        return f"bench/run_two_hosts.sh cannot run here: {done.stderr}"
    return ""


def on_two_hosts(worker, args=(), env=None, timeout=120,
                 placement="block"):
    """Runs tests/mpi/<worker>.py on two emulated hosts of two ranks each,
    in blocks (0 and 1 on the first host) or alternating (`placement`
    "cyclic": 0 and 2 there); returns as run_job does."""
    if two_hosts_missing():
        pytest.skip(two_hosts_missing())
    full_env = dict(os.environ, MPIEXEC=MPIEXEC, TIMEOUT=str(timeout - 10),
                    OMP_NUM_THREADS="1", PLACEMENT=placement)
    full_env.update(worker_env(env))
    return run_command([TWO_HOSTS, *worker_command(worker, args)], full_env,
                       timeout)


# auto: two levels where the hosts' ranks alternate; in blocks MPICH's
# flat all-reduce crosses the link as seldom (bench/hierarchical_bench.py).
@pytest.mark.parametrize("setting,placement,path", [
    ("1", "block", "two_level"), ("auto", "block", "flat"),
    ("auto", "cyclic", "two_level"), ("0", "cyclic", "flat")])
def test_two_hosts_match_numpy_on_the_path_the_setting_says(setting,
                                                            placement, path):
    code, out, err, _ = on_two_hosts("two_level", [path],
                                     {"NNCOMM_HIERARCHICAL": setting},
                                     placement=placement)
    passed("two_level", 4, code, out, err)
    # Only an explicit 1 says that the uneven group runs flat.
    assert (UNEVEN_NOTE in err) == (setting == "1"), err
    assert err.count(UNEVEN_NOTE) <= 1, err


def test_two_hosts_in_small_pieces():
    """Several pieces per all-reduce, the last one shorter and odd."""
    code, out, err, _ = on_two_hosts(
        "two_level", ["two_level"], {"NNCOMM_CHUNK_BYTES": "262148"},
        placement="cyclic")
    passed("two_level", 4, code, out, err)


@pytest.mark.parametrize("mode", ("callback", "solver"))
def test_join_on_two_hosts(mode):
    """A rank that left comm.join() makes the two-level steps too."""
    code, out, err, _ = on_two_hosts(
        "join", [mode], {"NNCOMM_TIMEOUT": "60", "NNCOMM_HIERARCHICAL": "1"})
    passed("join", 4, code, out, err)


@pytest.mark.parametrize("mode", ("bad", "differ_hierarchical"))
def test_bad_or_differing_setting_fails_init_on_every_rank(mode):
    """NNCOMM_HIERARCHICAL=sometimes, or 0 on one rank only: every rank's
    init() raises, naming it."""
    code, out, err, _ = on_two_hosts("settings", [mode])
    passed("settings", 4, code, out, err)


def test_a_rank_that_never_comes_is_named_by_world_rank():
    """Rank 3 sleeps instead of the all-reduce: its host's other rank waits
    in the reduce-scatter within the host, the first host's ranks in the
    all-reduce across hosts; each names world rank 3."""
    code, out, err, _ = on_two_hosts(
        "waits", ["timeout", "all_reduce", f"timeout-{uuid.uuid4().hex}"],
        {"NNCOMM_TIMEOUT": "3", "NNCOMM_HIERARCHICAL": "1"}, timeout=90)
    assert code != 0, out
    for rank in (0, 1, 2):
        line = re.search(rf"^rank {rank}: .*$", out, re.MULTILINE)
        assert line is not None, out + err
        assert "NNCOMM_TIMEOUT" in line.group(0), line.group(0)
        assert "world ranks [3] never arrived" in line.group(0), line


@pytest.mark.parametrize("setting", ("1", "auto"))
def test_one_host_stays_flat(setting):
    run_worker("two_level", 4, ["flat"],
               env={"NNCOMM_HIERARCHICAL": setting})
