"""The MLP of train_mlp.py trained with CNTK's 1-bit SGD.

Run with any number of ranks:

    .venv/bin/nncomm-run -np 2 examples/train_1bit.py

It is train_distributed_solver.py with the solver CNTK's
``data_parallel_distributed_learner(num_quantization_bits=1)`` would make:
``nncomm.data_parallel_solver(..., num_quantization_bits=1)``. After
backward, each rank sends each column of its gradients as one bit per
element (the sign) and two floats (the means of the column's negative and
non-negative values), about 1/32 of float32's bytes, in one all-gather;
every rank sums every rank's decoded gradients. Each rank adds what its
quantization lost to its next step's gradient (error feedback), which is
what keeps training converging.
"""
import nncomm
from train_distributed_solver import train


def main():
    train(__doc__.split("\n")[0], lambda solver, comm:
          nncomm.data_parallel_solver(solver, comm, num_quantization_bits=1))


if __name__ == "__main__":
    main()
