"""The examples train on 2 ranks and end with the same parameters on each
(one or two short epochs: the README runs them in full)."""
import os
import re
import sys

import pytest

from launcher import run_program

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "examples")


@pytest.mark.parametrize("script,args", [
    ("train_mlp.py", []), ("train_mlp.py", ["--overlap"]),
    ("train_distributed_solver.py", []), ("train_1bit.py", []),
    ("train_resnet_digits.py", []),
    ("train_resnet_digits.py", ["--overlap"]),
    ("train_resnet_digits.py", ["--overlap", "--sync-bn"])])
def test_example_keeps_ranks_in_step(script, args):
    run_example(script, "--epochs", "1", *args)


def run_example(script, *args):
    """Runs examples/<script> on 2 ranks; its stdout, once it has exited 0
    and reported the same parameters on both."""
    code, out, err, _ = run_program(
        [sys.executable, os.path.join(EXAMPLES, script), *args], 2,
        timeout=300)
    assert code == 0, out + err
    assert "parameter checksums match across 2 ranks" in out, out + err
    return out


def test_resnet_resumes_where_its_checkpoint_left_off(tmp_path):
    """Resumed from epoch 1's checkpoint, the second epoch comes out as it
    did without stopping: parameters, running statistics and solver state
    all restored on both ranks."""
    script = "train_resnet_digits.py"
    whole = run_example(script, "--epochs", "2",
                        "--checkpoint-dir", tmp_path)
    resumed = run_example(script, "--epochs", "2",
                          "--checkpoint-dir", tmp_path, "--resume", "1")
    first = re.search(r"^epoch   1 .*  (test loss \S+ accuracy \S+)$",
                      whole, re.MULTILINE)
    assert first, whole
    assert re.search(rf"^resumed at epoch 2 from .*: {first.group(1)}$",
                     resumed, re.MULTILINE), whole + resumed
    assert "epoch   1 " not in resumed, resumed
    second = re.findall(r"^epoch   2 .*$", whole, re.MULTILINE)
    assert second and second == re.findall(r"^epoch   2 .*$", resumed,
                                           re.MULTILINE), whole + resumed


def test_resnet_without_a_checkpoint_fails_on_every_rank(tmp_path):
    code, out, err, _ = run_program(
        [sys.executable, os.path.join(EXAMPLES, "train_resnet_digits.py"),
         "--checkpoint-dir", tmp_path, "--resume"], 2, timeout=120)
    assert code != 0, out + err
    assert err.count(f"no checkpoint in {tmp_path}") == 2, out + err


def test_an_unmodified_nnabla_script_trains_on_two_ranks():
    """examples/nnabla_script.py never imports nncomm: under nncomm's
    launcher nnabla's own communicator factory, callback route and sync
    batch normalization reach nncomm."""
    from launcher import run_command
    code, out, err, _ = run_command(
        [sys.executable, "-m", "nncomm.run", "-np", "2",
         os.path.join(EXAMPLES, "nnabla_script.py")],
        dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert code == 0, out + err
    found = re.search(r"^2 ranks: test accuracy (\S+)$", out, re.MULTILINE)
    assert found and float(found.group(1)) > 0.85, out + err
