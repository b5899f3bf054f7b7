"""The MPI workers of tests/mpi on 1 to 4 ranks.

Each worker runs hundreds to thousands of checks in one launch (importing
nnabla costs about a second per launch) and fails with the list of every
mismatch, rank by rank.
"""
import os
import subprocess
import sys
import time

import pytest

from launcher import RANK_COUNTS, run_job, run_worker
from nncomm.timeline import is_complete, load, part_path

WORKERS = ["basics", "all_reduce", "rooted", "gather_scatter", "zeroing",
           "parameters", "errors", "alltoall_gatherv", "async_ops"]


@pytest.mark.parametrize("n", RANK_COUNTS)
@pytest.mark.parametrize("worker", WORKERS)
def test_worker(worker, n):
    run_worker(worker, n)


# The same checks with the paths chosen by size moved down to small data:
# every array >= 64 bytes is reduced where it lies instead of through the
# fusion buffer, or every MPI reduction is cut into 4 KiB pieces.
TUNED = {
    "direct64": {"NNCOMM_DIRECT_BYTES": "64"},
    "chunk4k": {"NNCOMM_CHUNK_BYTES": "4096"},
}


@pytest.mark.parametrize("n", (2, 3))
@pytest.mark.parametrize("worker", ["all_reduce", "rooted", "zeroing",
                                    "parameters"])
@pytest.mark.parametrize("tuning", sorted(TUNED))
def test_worker_tuned(tuning, worker, n):
    out = run_worker(worker, n, env=TUNED[tuning])
    # The report line echoes the tunables, so they did reach the ranks.
    for key, value in TUNED[tuning].items():
        assert f"{key}={value}" in out


@pytest.mark.parametrize("mode", ("bad", "differ", "differ_checks",
                                  "differ_gpu", "same"))
def test_settings_checked_at_init(mode):
    run_worker("settings", 1 if mode == "bad" else 3, [mode], timeout=60)


@pytest.mark.parametrize("every_call", (False, True))
@pytest.mark.parametrize("n", (2, 3))
def test_mismatched_calls_raise(n, every_call):
    run_worker("check_calls", n,
               env={"NNCOMM_CHECK_CALLS": "1"} if every_call else None)


def test_large_tensor_two_ranks():
    run_worker("large", 2, timeout=300)


# -- all_reduce_callback (the function_post_hook reducing during backward) --

@pytest.mark.parametrize("n", RANK_COUNTS)
def test_all_reduce_callback(n):
    run_worker("callback", n)


@pytest.mark.parametrize("n,route", [(1, "hook"), (2, "hook"), (3, "hook"),
                                     (2, "callbacks")])
def test_all_reduce_callback_errors(n, route):
    run_worker("callback_errors", n, [route])


@pytest.mark.parametrize("n", (2, 4))
def test_all_reduce_callback_training_equals_single_process(n):
    run_worker("callback_training", n)


@pytest.mark.parametrize("launch", ("eager", "deferred"))
def test_all_reduce_callback_training_with_a_fixed_schedule(launch):
    out = run_worker("callback_training", 2, env={"NNCOMM_LAUNCH": launch})
    assert f"NNCOMM_LAUNCH={launch}" in out


# The callback's buckets cut into 4 KiB MPI pieces; its engine thread
# spinning on MPI_Test instead of sleeping between tests (only at 2 ranks:
# three spinning ranks on two cores take a minute); its buckets all
# launched at the end of backward.
CALLBACK_TUNED = {
    "chunk4k": {"NNCOMM_CHUNK_BYTES": "4096"},
    "poll0": {"NNCOMM_ENGINE_POLL_US": "0"},
    "deferred": {"NNCOMM_LAUNCH": "deferred"},
}


@pytest.mark.parametrize("tuning,n", [("chunk4k", 2), ("chunk4k", 3),
                                      ("poll0", 2), ("deferred", 3)])
def test_all_reduce_callback_tuned(tuning, n):
    out = run_worker("callback", n, env=CALLBACK_TUNED[tuning])
    for key, value in CALLBACK_TUNED[tuning].items():
        assert f"{key}={value}" in out


def test_all_reduce_callback_long_run_keeps_memory_and_threads_flat():
    out = run_worker("callback_long_run", 2, timeout=300)
    for mode in ("once", "new", "rebuilt"):
        assert f"{mode}: rss" in out


@pytest.mark.parametrize("n", (2, 3))
def test_two_callbacks_on_one_group_in_one_backward(n):
    run_worker("callback_one_group_twice", n, timeout=60)


@pytest.mark.parametrize("n", (2, 3))
def test_callback_usable_after_a_backward_that_raised(n):
    run_worker("callback_after_failure", n, timeout=120)


# -- the launcher itself ----------------------------------------------------

def test_launcher_passes_a_good_job():
    run_worker("selftest", 2, ["pass"])


@pytest.mark.parametrize("mode", ["mismatch", "raise-one"])
def test_launcher_reports_failures(mode):
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as failure:
        run_worker("selftest", 2, [mode], timeout=60)
    # A rank that raised alone must abort the job, not leave the others
    # waiting in the barrier until the timeout.
    assert time.monotonic() - start < 50
    assert "exited with" in str(failure.value)
    expected = "FAIL all_reduce of ones" if mode == "mismatch" \
        else "the last rank fails alone"
    assert expected in str(failure.value)


def test_launcher_kills_a_hang():
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as failure:
        run_worker("selftest", 2, ["hang"], timeout=8)
    assert "hung for 8 s" in str(failure.value)
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("n", (1, 2, 3, 4))
def test_nnabla_sync_batch_normalization_with_nncomm(n):
    run_worker("sync_batch_norm", n, timeout=120)


@pytest.mark.parametrize("n", (1, 2, 3))
def test_callback_bit_for_bit_in_every_dtype_path(n):
    run_worker("callback_bitwise", n, timeout=120)


@pytest.mark.parametrize("n,route", [(1, "hook"), (2, "hook"), (3, "hook"),
                                     (2, "callbacks"), (3, "callbacks"),
                                     (2, "python")])
def test_callback_on_the_graphs_users_build(n, route):
    """Passed as function_post_hook, or as nnabla's scripts pass it, in
    backward's communicator_callbacks (most calls counted in C++); or as a
    hook with an nnabla whose types nncomm does not know (every gradient
    read through Python)."""
    run_worker("callback_graphs", n, [route], timeout=120)


@pytest.mark.parametrize("n", (1, 2, 3))
def test_callback_backward_that_does_not_reach_its_end(n):
    run_worker("callback_lifecycle", n, timeout=120)


@pytest.mark.parametrize("n", (1, 2, 3))
def test_callback_follows_runtime_dtypes_and_sizes(n):
    run_worker("callback_dtypes", n, timeout=120)


@pytest.mark.parametrize("n", (2, 3))
def test_callback_one_rank_fails(n):
    run_worker("callback_one_rank_fails", n, timeout=120)


# Packed (buckets of 16 elements: gradients split across them), then with
# the weights reduced where they lie and the check left to the setting.
CHECKED_IN_PLACE = {"NNCOMM_DIRECT_BYTES": "64", "NNCOMM_CHECK_FINITE": "1"}


@pytest.mark.parametrize("n,route,env", [
    (2, "hook", None), (3, "hook", None), (2, "callbacks", None),
    (3, "solver", None), (2, "reducer", None), (3, "quantized", None),
    (3, "hook", CHECKED_IN_PLACE), (2, "callbacks", CHECKED_IN_PLACE),
    (2, "solver", CHECKED_IN_PLACE), (3, "reducer", CHECKED_IN_PLACE),
    (2, "quantized", CHECKED_IN_PLACE)])
def test_nonfinite_gradient_raises_on_every_rank(n, route, env):
    run_worker("check_finite", n, [route], env=env, timeout=120)


@pytest.mark.parametrize("n", (2, 3))
def test_two_threads_on_one_group_take_turns(n):
    run_worker("threads", n, timeout=60)


# -- a failure of one rank alone ---------------------------------------------

@pytest.mark.parametrize("n", (2, 3))
def test_callback_staging_failing_on_one_rank_raises_everywhere(n):
    run_worker("local_failures", n, ["callback"], timeout=120)


def test_list_collective_failing_on_one_rank_aborts_the_job():
    code, out, err, seconds = run_job("local_failures", 3, ["all_reduce"],
                                      timeout=120)
    assert code != 0, out
    assert "MemoryError" in err and "NNCOMM_TEST_FAIL_ALLOCATION" in err, err
    assert "world rank 2 is aborting the job" in err, err
    # The others would wait for NNCOMM_TIMEOUT (30 min) without the abort,
    # which comes 5 s after the failure.
    assert seconds < 5 + 30, seconds


@pytest.mark.parametrize("n", (2, 3))
def test_gpu_arrays_are_refused_clearly_without_a_gpu(n):
    # Bad GPU arrays raise before any rank communicates; valid ones raise
    # on every rank with the reason (no CUDA in the build, or the runtime's
    # own words), without nnabla imported.
    run_worker("gpu_arrays", n, ["refused"])


@pytest.mark.parametrize("n", RANK_COUNTS)
def test_gradient_reducer(n):
    # Its largest gradient is over NNCOMM_DIRECT_BYTES, as a weight of a
    # real model would be, but small enough that buckets of 7 elements are
    # ~430 all-reduces: at 300,000 elements and the default threshold, a
    # 4-rank run took 60 to over 360 s on 2 cores shared with other jobs.
    run_worker("reducer", n, env={"NNCOMM_DIRECT_BYTES": "8192"},
               timeout=120)


@pytest.mark.parametrize("n", RANK_COUNTS)
def test_bucket_hooks(n):
    run_worker("bucket_hooks", n, timeout=120)


@pytest.mark.parametrize("n", (1, 2, 3))
def test_bucket_hook_errors_raise_on_every_rank(n):
    # A rank left waiting would time out after 5 s, failing "promptly".
    run_worker("bucket_hook_errors", n, env={"NNCOMM_TIMEOUT": "5"},
               timeout=120)


@pytest.mark.parametrize("n", (2, 3))
def test_powersgd_against_numpy(n):
    run_worker("powersgd", n, timeout=120)


@pytest.mark.parametrize("n", (1, 2))
def test_cuda_context_arrays_take_the_gpu_path(n):
    run_worker("cuda_context", n)


@pytest.mark.parametrize("n", RANK_COUNTS)
def test_distributed_solver_steps_as_one_process(n):
    run_worker("distributed_solver", n, timeout=120)


@pytest.mark.parametrize("n", RANK_COUNTS)
def test_block_momentum_solver_matches_bmuf_reference(n):
    run_worker("block_momentum", n, timeout=120)


@pytest.mark.parametrize("n", RANK_COUNTS)
def test_objects(n):
    # broadcast_parameters / _solver_state / _object, allgather_object and
    # workers, is_main, is_capable, finalize.
    run_worker("objects", n)


@pytest.mark.parametrize("n", (1, 3))
def test_grouped_all_reduce(n):
    run_worker("grouped", n)


@pytest.mark.parametrize("n", (2, 4))
def test_schemes_converge_on_digits(n):
    run_worker("convergence", n, timeout=240)


@pytest.mark.parametrize("n", RANK_COUNTS)
def test_sparse_gradients(n):
    run_worker("sparse", n)


@pytest.mark.parametrize("n", RANK_COUNTS)
def test_quantized(n):
    # QuantizedReducer and DistributedSolver / data_parallel_solver with
    # quantized compression, bit for bit against numpy and nnabla in one
    # process; misuse raising on every rank.
    run_worker("quantized", n, timeout=120)


# -- the timeline (NNCOMM_TIMELINE, start_timeline / stop_timeline) ---------

@pytest.mark.parametrize("n", (1, 2, 4))
def test_timeline_records_training_and_collectives(n, tmp_path):
    # NNCOMM_STALL_WARNING=1: the worker's late collective is reported.
    run_worker("timeline", n, ["record", tmp_path],
               env={"NNCOMM_STALL_WARNING": "1"})


@pytest.mark.parametrize("n", (1, 2))
def test_timeline_from_the_environment_is_merged_at_exit(n, tmp_path):
    path = tmp_path / "env.json"
    run_worker("timeline", n, ["env", tmp_path],
               env={"NNCOMM_TIMELINE": str(path)})
    assert sorted(os.listdir(tmp_path)) == ["env.json"]
    run_worker("timeline", 1, ["check", path, n])


def test_timeline_off_writes_nothing(tmp_path):
    run_worker("timeline", 2, ["off", tmp_path])


def test_timeline_of_a_job_that_died_merges_by_hand(tmp_path):
    run_job("timeline", 2, ["die", tmp_path])
    path = str(tmp_path / "died.json")
    parts = [part_path(path, r) for r in range(2)]
    assert all(os.path.exists(p) and not is_complete(p) for p in parts)
    out = subprocess.run([sys.executable, "-m", "nncomm.timeline", "merge",
                          path, *parts], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("was incomplete") == 2, out.stdout
    events = load(path)
    for rank in range(2):
        names = {e["name"] for e in events if e["pid"] == rank}
        assert {"backward", "pack", "reduce", "unpack"} <= names, names


# -- the flight recorder (NNCOMM_FLIGHT_RECORDER, python -m nncomm.flight) --

def test_flight_record_on_request_and_on_sigusr1(tmp_path):
    run_worker("flight_recorder", 2, ["request"], timeout=60,
               env={"NNCOMM_FLIGHT_RECORDER_DIR": str(tmp_path)})
    assert sorted(os.listdir(tmp_path)) == [
        "asked", "nncomm-flight-0.json", "nncomm-flight-1.json"]


# mode -> (the rank to blame, what the record of its call says): a rank
# that skips one all_reduce, one that makes a bcast instead, one that stops
# and one that is killed, which both leave no record. The killed rank runs
# under a shell that outlives it, so that mpiexec does not see it die: it
# would end the others at once (MPICH's, under -disable-auto-cleanup, as
# soon as one of them writes anything), leaving their records to chance.
DIVERGING = {
    "skip": (1, "in steps"),
    "differ": (2, "bcast of 1 arrays"),
    "stop": (2, None),
    "kill": (2, None),
}
OUTLIVED = ("sh", "-c", '"$@"; sleep 60', "sh")


@pytest.mark.parametrize("mode", sorted(DIVERGING))
def test_flight_records_name_the_rank_that_diverged(mode, tmp_path):
    from nncomm import flight
    culprit, said = DIVERGING[mode]
    code, out, err, seconds = run_job(
        "flight_recorder", 3, [mode], timeout=60,
        env={"NNCOMM_FLIGHT_RECORDER_DIR": str(tmp_path),
             "NNCOMM_TIMEOUT": "3"},
        last_rank_prefix=OUTLIVED if mode == "kill" else ())
    assert code != 0, out + err
    # The stall reports find the calls apart within seconds; the stopped
    # or killed rank's others time out after 3.
    assert seconds < 3 + 5 + 15, seconds
    # A rank ended while it wrote a later record leaves its temporary file.
    files = sorted(f for f in os.listdir(tmp_path) if f.endswith(".json"))
    gone = mode in ("stop", "kill")
    survivors = [r for r in range(3) if not gone or r != culprit]
    assert files == [f"nncomm-flight-{r}.json" for r in survivors], \
        (files, out + err)
    dumps = flight.load(str(tmp_path))
    analysis = flight.analyze(dumps)
    assert flight.culprits(analysis) == [culprit], (analysis, out + err)
    first = analysis.divergences[0]
    assert first.group == [0, 1, 2] and first.channel == 0, first
    # The others wait in the second all_reduce of 5 elements.
    assert first.expected["call"] == "all_reduce of 1 arrays", first
    assert first.waiting == [r for r in survivors if r != culprit], first
    if gone:
        assert first.no_record == [culprit], first
    else:
        assert said in flight.describe(first.different[culprit]), first
    shown = subprocess.run([sys.executable, "-m", "nncomm.flight",
                            str(tmp_path)], capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert f"diverged first: world rank {culprit}\n" in shown.stdout, \
        shown.stdout
    assert len(shown.stdout.splitlines()) <= 25, shown.stdout


def test_flight_recorder_off_writes_nothing(tmp_path):
    off = {"NNCOMM_FLIGHT_RECORDER_DIR": str(tmp_path),
           "NNCOMM_FLIGHT_RECORDER": "0"}
    run_worker("flight_recorder", 2, ["request"], timeout=60, env=off)
    code, out, err, _ = run_job(
        "flight_recorder", 3, ["differ"], timeout=60,
        env=dict(off, NNCOMM_TIMEOUT="3"))
    assert code != 0 and "make different calls" in out, out + err
    assert os.listdir(tmp_path) == []
    assert "flight record" not in err, err


# comm.join(): ranks with 3, 5, 1 and 4 batches (tests/mpi/join.py) end
# with the parameters and solver state of the reference schedule.
@pytest.mark.parametrize("mode,n,checks", [
    ("callback", 1, None), ("callback", 3, None), ("callback", 3, "1"),
    ("cc", 2, None), ("active", 3, None), ("solver", 4, None),
    ("fp16", 3, None), ("quantized", 3, None), ("bmuf", 3, None),
    ("throw", 3, None), ("throw_cc", 2, None)])
def test_join_uneven_inputs(mode, n, checks):
    env = {"NNCOMM_TIMEOUT": "60"}
    if checks is not None:
        env["NNCOMM_CHECK_CALLS"] = checks
    run_worker("join", n, [mode], env=env, timeout=120)


@pytest.mark.parametrize("mode,message", [
    ("bcast_left", "the ranks still training broadcast from world rank 1, "
                   "whose data has ended"),
    ("raise", "world rank 1 left comm.join() with ValueError: a bad batch "
              "on rank 1")])
def test_join_failure_raises_on_every_rank(mode, message):
    code, out, err, seconds = run_job("join", 3, [mode],
                                      env={"NNCOMM_TIMEOUT": "60"},
                                      timeout=120)
    assert code != 0, out
    for rank in range(3):
        assert f"world rank {rank} is aborting the job: {message}" in err \
            or (mode == "raise" and rank == 1), err
    assert err.count(message) >= 3, err
    assert seconds < 30, seconds


@pytest.mark.parametrize("shard", ["state", "gradients"])
@pytest.mark.parametrize("n", RANK_COUNTS)
def test_sharded_state_steps_as_unsharded(n, shard):
    # ZeRO stages 1 and 2: DistributedSolver(shard=...) against the
    # unsharded one, the digits MLP, state bytes per rank, stage 2's
    # gradients (reduced where owned, NaN elsewhere) and bad input.
    run_worker("sharded_state", n, ["steps", f"--shard={shard}"],
               timeout=120)


@pytest.mark.parametrize("shard", ["state", "gradients"])
def test_sharded_checkpoint_loads_at_other_rank_counts(tmp_path, shard):
    # Saved at 2 ranks, resumed at 3 and at 1, and consolidated.
    run_worker("sharded_state", 2, ["save", tmp_path, f"--shard={shard}"])
    for n in (3, 1):
        run_worker("sharded_state", n, ["load", tmp_path, f"--shard={shard}"])
