"""``python -m nncomm script.py [args]``: runs a script as one rank of a
data-parallel job, as ``python -m mpi4py`` does (a rank that raises aborts
the job, so no other rank waits for it), with nnabla's communicator entry
points answered by nncomm first (``nncomm.nnabla_adapter.entry``,
``NNCOMM_NNABLA``). ``nncomm-run`` starts every rank this way; under
another launcher:

    mpiexec -n 4 python -m nncomm train.py
    srun -n 4 --mpi=pmi2 python -m nncomm train.py

Takes what ``python -m mpi4py`` takes: a script, ``-m module`` or
``-c command``, then the program's arguments.
"""
from mpi4py.run import main

from nncomm.nnabla_adapter.entry import install

install()
main()
