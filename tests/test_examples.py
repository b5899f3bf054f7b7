"""The examples train on 2 ranks and end with the same parameters on each
(one short epoch: the README runs them in full)."""
import os
import sys

import pytest

from launcher import run_program

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "examples")


@pytest.mark.parametrize("script,args", [
    ("train_mlp.py", []), ("train_mlp.py", ["--overlap"]),
    ("train_distributed_solver.py", []), ("train_1bit.py", [])])
def test_example_keeps_ranks_in_step(script, args):
    code, out, err, _ = run_program(
        [sys.executable, os.path.join(EXAMPLES, script), "--epochs", "1",
         *args], 2, timeout=300)
    assert code == 0, out + err
    assert "parameter checksums match across 2 ranks" in out, out + err
