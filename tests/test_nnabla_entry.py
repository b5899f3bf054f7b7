"""Scripts written for nnabla, which never import nncomm, train
data-parallel with no edit: launched by nncomm-run, or by mpiexec with
``python -m nncomm``, nnabla's communicator factories and
create_communicator() answer with nncomm's communicator
(nncomm.nnabla_adapter.entry). A job of several ranks that cannot run
data-parallel raises on its ranks instead of training one model per rank.
"""
import os
import sys
import types

import numpy as np
import pytest

from launcher import MPIEXEC, run_command
from nncomm.nnabla_adapter import entry as nnabla_entry
from nncomm.launched import launched_size

TESTS = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(TESTS, "nnabla_scripts", "train_data_parallel.py")
RANK = [sys.executable, "-m", "nncomm"]
LAUNCH = [sys.executable, "-m", "nncomm.run"]


def environment(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("NNCOMM_NNABLA", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE",
                        "SLURM_STEP_NUM_TASKS", "MV2_COMM_WORLD_SIZE")}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def run(command, **extra):
    return run_command(command, environment(**extra), timeout=120)[:3]


def parameters(out, rank):
    with np.load(f"{out}.rank{rank}.npz") as f:
        return {name: f[name] for name in f.files}


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """The parameters the script trains alone, on the whole global batch
    (run as a plain script: the wrapper carries on single-process)."""
    out = str(tmp_path_factory.mktemp("one") / "params")
    code, stdout, stderr = run([sys.executable, SCRIPT, "wrapper", out])
    assert code == 0 and "rank 0 of 1 trained" in stdout, stdout + stderr
    return parameters(out, 0)


def assert_data_parallel(out, stdout, stderr, one_rank):
    """Both ranks trained together: the same parameters, those of one rank
    on the global batch (to float32 rounding: the sums differ in order)."""
    assert sorted(line for line in stdout.splitlines()
                  if line.endswith("trained")) == \
        ["rank 0 of 2 trained", "rank 1 of 2 trained"], stdout + stderr
    first, second = parameters(out, 0), parameters(out, 1)
    assert first.keys() == one_rank.keys()
    for name, value in one_rank.items():
        assert np.array_equal(first[name], second[name]), name
        np.testing.assert_allclose(first[name], value, rtol=1e-5,
                                   atol=1e-6, err_msg=name)


@pytest.mark.parametrize("how", ["factory", "create", "create_default",
                                 "wrapper"])
def test_nnabla_script_trains_data_parallel_under_nncomm_run(
        how, one_rank, tmp_path):
    out = str(tmp_path / "params")
    code, stdout, stderr = run(LAUNCH + ["-np", "2", SCRIPT, how, out])
    assert code == 0, stdout + stderr
    assert_data_parallel(out, stdout, stderr, one_rank)
    # nnabla's default extension, cudnn, is not installed here.
    assert (stderr.count("the communicator takes a CPU context") ==
            2 * (how == "create_default")), stderr
    # nnabla, asked for a CPU communicator, warns of Open MPI's dlopen.
    assert "libmpi.so" not in stderr, stderr


def test_the_mpiexec_one_liner(one_rank, tmp_path):
    out = str(tmp_path / "params")
    code, stdout, stderr = run(
        [MPIEXEC, "-n", "2", *RANK, SCRIPT, "wrapper", out])
    assert code == 0, stdout + stderr
    assert_data_parallel(out, stdout, stderr, one_rank)


def test_opting_out_leaves_nnabla_as_it_is(tmp_path):
    """--nnabla off: nnabla's factory fails on a CPU context, and the
    wrapper trains alone on each rank, as without nncomm."""
    out = str(tmp_path / "params")
    code, stdout, stderr = run(
        LAUNCH + ["-np", "2", "--nnabla", "off", SCRIPT, "wrapper", out])
    assert code == 0, stdout + stderr
    assert stdout.count("rank 0 of 1 trained") == 2, stdout + stderr
    assert "could not be found" in stdout


def test_ranks_that_disagree_fail_instead_of_training_alone(tmp_path):
    """Settings that differ between the ranks make init() fail; through
    the catch-everything wrapper that would have been one model per rank.
    """
    out = str(tmp_path / "params")
    rank = [*RANK, SCRIPT, "wrapper", out]
    code, stdout, stderr = run(
        [MPIEXEC, "-n", "1", "-env", "NNCOMM_DIRECT_BYTES", "64", *rank,
         ":", "-n", "1", "-env", "NNCOMM_DIRECT_BYTES", "128", *rank])
    assert code != 0
    assert "DataParallelError" in stderr, stdout + stderr
    assert "NNCOMM_DIRECT_BYTES differs between ranks" in stderr
    assert "trained" not in stdout and not os.path.exists(f"{out}.rank0.npz")


def test_an_mpi_that_cannot_join_the_launcher_fails(tmp_path):
    """A process that a launcher of another MPI started as one of two
    (Open MPI's variable set), whose MPI sees only itself."""
    out = str(tmp_path / "params")
    code, stdout, stderr = run([*RANK, SCRIPT, "wrapper", out],
                               OMPI_COMM_WORLD_SIZE="2")
    assert code != 0
    assert "DataParallelError" in stderr, stdout + stderr
    assert "one of 2 ranks (OMPI_COMM_WORLD_SIZE=2 (Open MPI's mpirun))" \
        in stderr
    assert "sees a world of 1" in stderr
    assert "trained" not in stdout


# --- without MPI ------------------------------------------------------------

@pytest.mark.parametrize("environ,size", [
    ({}, 1),
    ({"PMI_SIZE": "4"}, 4),
    ({"OMPI_COMM_WORLD_SIZE": "2", "SLURM_STEP_NUM_TASKS": "8"}, 8),
    ({"PMI_SIZE": "four", "MV2_COMM_WORLD_SIZE": "3"}, 3),
    ({"PMI_SIZE": "1"}, 1),
])
def test_launched_size(environ, size):
    got, source = launched_size(environ)
    assert got == size
    assert (source is None) == (size == 1)


@pytest.mark.parametrize("value,mode", [
    ("", "auto"), ("auto", "auto"), (" NNCOMM ", "nncomm"), ("off", "off")])
def test_mode(value, mode):
    assert nnabla_entry.mode({"NNCOMM_NNABLA": value}) == mode


def test_unknown_mode():
    with pytest.raises(ValueError, match="NNCOMM_NNABLA='on'"):
        nnabla_entry.mode({"NNCOMM_NNABLA": "on"})


def test_auto_keeps_nnabla_s_communicator_where_it_has_one():
    """nnabla's factory answers where it can (nnabla-ext-cuda's NCCL
    communicator), every alias patched once."""
    def nnabla_factory(ctx):
        return ("nnabla's", ctx)

    module = types.ModuleType("nnabla.communicator")
    for name in nnabla_entry.FACTORIES:
        setattr(module, name, nnabla_factory)
    nnabla_entry.patch(module, "auto")
    patched = module.MultiProcessDataParallelCommunicator
    cuda = types.SimpleNamespace(backend=["cudnn:float", "cpu:float"])
    assert patched(cuda) == ("nnabla's", cuda)
    nnabla_entry.patch(module, "auto")
    assert all(getattr(module, name) is not nnabla_factory and
               getattr(module, name)._nncomm
               for name in nnabla_entry.FACTORIES)
    assert module.MultiProcessDataParallelCommunicator is patched
