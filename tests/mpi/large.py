"""One 256 MiB float32 tensor through all_reduce: far above the direct
threshold and made of many MPI pieces (NNCOMM_CHUNK_BYTES, 8 MiB by
default), so every piece must land at its own offset.

Rank r contributes (r + 1) * (i % 251): exact in float32, different in
every piece, and the expected sum and mean are known in closed form.
"""
import numpy as np

from _harness import Checker, make_comm, nd

COUNT = 64 << 20  # float32 elements: 256 MiB


def main():
    ck = Checker("large")
    comm, _ = make_comm()
    n = comm.size
    base = (np.arange(COUNT, dtype=np.int32) % 251).astype(np.float32)
    weights = sum(r + 1 for r in range(n))

    x = nd(base * np.float32(comm.rank + 1))
    comm.all_reduce(x)
    got = x.data
    ck.true(x.dtype == np.float32 and got.shape == (COUNT,),
            "256 MiB all_reduce keeps dtype and shape",
            f"{x.dtype} {got.shape}")
    bad = np.flatnonzero(got != base * np.float32(weights))
    ck.true(bad.size == 0, "256 MiB all_reduce sum",
            f"{bad.size} elements differ, first at {bad[:5].tolist()}")
    del got, x

    x = nd(base * np.float32(comm.rank + 1))
    comm.all_reduce([x], division=True, inplace=True)
    got = x.data
    # weights / n is a multiple of 0.5; times an integer < 251 it is exact.
    bad = np.flatnonzero(got != base * np.float32(weights / n))
    ck.true(bad.size == 0, "256 MiB all_reduce mean (inplace)",
            f"{bad.size} elements differ, first at {bad[:5].tolist()}")
    ck.finish()


main()
