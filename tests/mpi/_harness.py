"""Shared pieces of the MPI workers: the communicator, reproducible per-rank
data, numpy references and a check recorder.

A worker runs on every rank under ``mpiexec ... python -m mpi4py``. Value
checks record failures instead of raising, so that one launch reports every
mismatch and all ranks keep issuing the same collectives; an unexpected
exception still propagates and the mpi4py runner aborts the whole job.
"""
import os
import sys
import traceback
import zlib

import numpy as np
from mpi4py import MPI

import nnabla as nn
from nnabla.ext_utils import get_extension_context
from nnabla.function import PythonFunction

import nncomm.communicators as C

DTYPES = (np.float32, np.float64, np.float16, np.int32, np.int64)


def dtype_name(dtype):
    return np.dtype(dtype).name


def is_float(dtype):
    return np.dtype(dtype).kind == "f"


def make_comm():
    ctx = get_extension_context("cpu")
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
    return comm, ctx


def nd(array):
    # np.ascontiguousarray would turn a 0-d array into shape (1,).
    return nn.NdArray.from_numpy_array(np.array(array, order="C"))


# Contributions are a pure function of (key, world rank, shape, dtype), so
# every rank can rebuild what every other rank sent and compute the
# reference itself. Recomputing the large ones is the costly part of a
# worker, hence the cache.
_CACHE = {}


def contribution(key, rank, shape, dtype, kind="int"):
    """Rank `rank`'s array for `key`.

    kind "int": small integers in [-8, 8]; sums over at most 4 ranks stay
    within [-32, 32], exact in every dtype (float16 included), so results
    can be compared for equality.
    kind "rand": normal floats (or integers in [-1000, 1000)), for checks
    with a rounding tolerance.
    """
    shape = tuple(shape)
    dtype = np.dtype(dtype)
    cache_key = (key, rank, shape, dtype.str, kind)
    hit = _CACHE.get(cache_key)
    if hit is not None:
        return hit
    rng = np.random.default_rng(zlib.crc32(f"{key}|{rank}|{kind}".encode()))
    if kind == "int":
        a = rng.integers(-8, 9, size=shape)
    elif dtype.kind in "iu":
        a = rng.integers(-1000, 1000, size=shape)
    else:
        a = rng.standard_normal(size=shape) * 4
    a = np.asarray(a).astype(dtype)
    a.setflags(write=False)
    if a.size >= 4096:
        _CACHE[cache_key] = a
    return a


def reference(contribs, dtype, division=False, exact=True):
    """The float64 (int64) sum or mean of `contribs` and a per-element bound
    on how far a correct result in `dtype` may be from it.

    exact: the contributions are small integers, so every partial sum is
    representable and a sum must match exactly; a mean is one division,
    rounded once (at most eps * |mean|).
    Otherwise each of the n-1 additions of an MPI reduction in `dtype`
    rounds by at most eps/2 times a partial sum, itself at most sum|x_r|;
    n * eps * sum|x_r| bounds that with room (float16's eps is 2**-10, so
    float16 results may be off by ~0.1% of sum|x_r| per rank), and a
    division adds eps * |mean|.
    """
    dtype = np.dtype(dtype)
    n = len(contribs)
    if dtype.kind in "iu":
        total = np.sum([c.astype(np.int64) for c in contribs], axis=0)
        return total, np.zeros(total.shape)
    stacked = np.stack([c.astype(np.float64) for c in contribs])
    total = stacked.sum(axis=0)
    eps = float(np.finfo(dtype).eps)
    if exact:
        tol = np.zeros(total.shape)
    else:
        tol = n * eps * np.abs(stacked).sum(axis=0)
    if division:
        total = total / n
        tol = tol / n + eps * np.abs(total)
    return total, tol


_REF_CACHE = {}


def expected_sum(key, ranks, shape, dtype, division=False, kind="int"):
    """`reference` of what `ranks` contribute for `key` (cached when large,
    since the same data is reduced under several options)."""
    cache_key = (key, tuple(ranks), tuple(shape), np.dtype(dtype).str,
                 division, kind)
    hit = _REF_CACHE.get(cache_key)
    if hit is not None:
        return hit
    contribs = [contribution(key, r, shape, dtype, kind) for r in ranks]
    result = reference(contribs, dtype, division, exact=(kind == "int"))
    if contribs and contribs[0].size >= 4096:
        _REF_CACHE[cache_key] = result
    return result


class Checker:
    """Records checks; `finish` reports them and fails the launch if any
    rank saw a failure."""

    def __init__(self, worker):
        self.worker = worker
        self.world = MPI.COMM_WORLD
        self.count = 0
        self.failures = []

    def fail(self, what, detail=""):
        text = f"[rank {self.world.rank}] FAIL {what}"
        if detail:
            text += f"\n    {detail}"
        self.failures.append(text)
        # The first few printed at once as well: if a later collective
        # hangs, the timeout output still shows what went wrong first.
        if len(self.failures) <= 10:
            print(text, file=sys.stderr, flush=True)

    def true(self, ok, what, detail=""):
        self.count += 1
        if not ok:
            self.fail(what, detail)
        return bool(ok)

    def equal(self, got, expected, what):
        return self.true(got == expected, what,
                         f"got {got!r}, expected {expected!r}")

    def array(self, x, expected, what, dtype=None, tol=None):
        """`x` (an NdArray) holds `expected` in `dtype`, within `tol`
        element by element (exactly when `tol` is None or all zero)."""
        self.count += 1
        dtype = np.dtype(dtype if dtype is not None else expected.dtype)
        expected = np.asarray(expected)
        if x.dtype != dtype:
            self.fail(what, f"dtype {np.dtype(x.dtype).name}, expected "
                            f"{dtype.name}")
            return False
        got = np.array(x.data)
        if got.shape != expected.shape:
            self.fail(what, f"shape {got.shape}, expected {expected.shape}")
            return False
        if tol is None or not np.any(tol):
            if dtype.kind == "f":
                bad = got.astype(np.float64) != expected.astype(np.float64)
            else:
                bad = got.astype(np.int64) != expected.astype(np.int64)
        else:
            bad = ~(np.abs(got.astype(np.float64) - expected) <= tol)
        if np.any(bad):
            idx = np.argwhere(bad)[:3]
            samples = ", ".join(
                f"[{tuple(int(k) for k in i)}] got {got[tuple(i)]!r} "
                f"expected {expected[tuple(i)]!r}"
                + (f" tol {tol[tuple(i)]:.3g}" if tol is not None else "")
                for i in idx)
            self.fail(what, f"{int(np.sum(bad))} of {bad.size} elements "
                            f"differ: {samples}")
            return False
        return True

    def raises(self, exc_type, substring, what, fn, *args, **kwargs):
        """`fn(*args, **kwargs)` raises `exc_type` whose message contains
        `substring`."""
        self.count += 1
        try:
            fn(*args, **kwargs)
        except exc_type as e:
            if substring.lower() not in str(e).lower():
                self.fail(what, f"{type(e).__name__}({str(e)!r}) does not "
                                f"mention {substring!r}")
                return False
            return True
        except Exception as e:
            self.fail(what, f"raised {type(e).__name__}({e!r}), expected "
                            f"{exc_type.__name__}: "
                            + traceback.format_exc(limit=2))
            return False
        self.fail(what, f"did not raise {exc_type.__name__}")
        return False

    def finish(self):
        everyone = self.world.allgather((self.count, self.failures))
        total = sum(c for c, _ in everyone)
        failures = [f for _, fs in everyone for f in fs]
        if self.world.rank == 0:
            if failures:
                print(f"{self.worker}: {len(failures)} of {total} checks "
                      f"FAILED on {self.world.size} ranks:", flush=True)
                for f in failures[:100]:
                    print(f, flush=True)
                if len(failures) > 100:
                    print(f"... and {len(failures) - 100} more", flush=True)
            else:
                print(f"{self.worker}: {total} checks passed on "
                      f"{self.world.size} ranks {env_note()}".rstrip(),
                      flush=True)
        if failures:
            sys.exit(1)


def standard_groups(comm, ck):
    """Creates the groups most workers run on; every rank calls it.

    Sub-groups cover a one-rank group, a reversed order (group rank i is
    ranks[i], not world rank i), a group that skips rank 0 and a gapped
    three-rank group.
    """
    n = comm.size
    specs = [("single_last", [n - 1])]
    if n >= 2:
        specs.append(("reversed", list(range(n))[::-1]))
    if n >= 3:
        specs.append(("skip0", [2, 1]))
    if n >= 4:
        specs.append(("gapped", [3, 0, 2]))
    groups = {"world": list(range(n))}
    for name, ranks in specs:
        ck.equal(comm.new_group((name, ranks)), name,
                 f"new_group(({name!r}, {ranks})) returns the name")
        groups[name] = ranks
    return groups


def placed(comm, group):
    """(the size of `group`, this rank's index in it), or None where this
    rank is not in it."""
    ranks = comm.find_group(group)
    if comm.rank not in ranks:
        return None
    return len(ranks), ranks.index(comm.rank)


def start(worker):
    """The opening of most workers: the checker, the communicator, and the
    standard groups this rank belongs to as (name, ranks) pairs."""
    ck = Checker(worker)
    comm, _ = make_comm()
    groups = standard_groups(comm, ck)
    return ck, comm, [(g, r) for g, r in groups.items() if comm.rank in r]


def env_note():
    """The tunables in effect, for the report line."""
    return " ".join(f"{k}={os.environ[k]}" for k in
                    ("NNCOMM_DIRECT_BYTES", "NNCOMM_CHUNK_BYTES",
                     "NNCOMM_ENGINE_POLL_US", "NNCOMM_LAUNCH")
                    if k in os.environ)


def big_count(dtype):
    """An odd element count just over 1 MiB: above the default direct
    threshold, so the array is reduced where it lies."""
    return (1 << 20) // np.dtype(dtype).itemsize + 3


# -- all_reduce_callback workers ---------------------------------------------

def world_gather(arrays):
    """Every rank's copies of `arrays` (NdArrays or numpy), indexed by world
    rank. Goes through mpi4py's pickling allgather, so references built from
    it do not depend on nncomm."""
    return MPI.COMM_WORLD.allgather(
        [np.array(a.data if isinstance(a, nn.NdArray) else a) for a in arrays])


def scaled_reference(contribs, scale=1.0, division=False,
                     reduce_dtype=np.float32, out_dtype=None):
    """The float64 sum (mean with `division`) of `contribs` times `scale`,
    and a per-element bound on how far a result reduced in `reduce_dtype`
    and stored in `out_dtype` may be from it.

    Each scaling, each of the n-1 additions and a division round by at most
    eps/2 of a value bounded by S = sum_r |x_r * scale| (or S/n), so
    (n + 2) * eps(reduce_dtype) * S covers them with room; storing the
    result in `out_dtype` (float16 gradients reduced in float32 and
    converted back) adds eps(out_dtype) * |result|; the subnormal terms
    cover results near zero, where float16's spacing is absolute.
    """
    reduce_dtype = np.dtype(reduce_dtype)
    out_dtype = np.dtype(out_dtype if out_dtype is not None else reduce_dtype)
    n = len(contribs)
    stacked = np.stack([np.asarray(c, np.float64) * scale for c in contribs])
    total = stacked.sum(axis=0)
    bound = np.abs(stacked).sum(axis=0)
    if division:
        total = total / n
        bound = bound / n
    r_info, o_info = np.finfo(reduce_dtype), np.finfo(out_dtype)
    tol = ((n + 2) * float(r_info.eps) * bound
           + float(o_info.eps) * np.abs(total)
           + (n + 2) * float(r_info.smallest_subnormal)
           + float(o_info.smallest_subnormal))
    return total, tol


def set_grad(x, values):
    """Writes `values` into the NdArray `x` (a gradient) in their dtype."""
    x.cast(np.asarray(values).dtype)[...] = values


def zeroing_over_stale(x, stale):
    """Makes `x` a zeroing array whose memory holds `stale`, so that a
    reduction reading the memory instead of zeros would show."""
    set_grad(x, stale)
    x.zero()


def proc_status():
    """(VmRSS in KiB, thread count) of this process from /proc/self/status."""
    rss = threads = None
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, threads


def exception_chain(e):
    """`e` and its __cause__/__context__ chain as one line (nnabla wraps an
    exception raised in a hook in SystemErrors; the cause is innermost)."""
    parts, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = f"{type(e).__name__}: {e}"
        if text not in parts:
            parts.append(text)
        e = e.__cause__ or e.__context__
    return " <- ".join(parts)


class ErrorChecks:
    """Base of the error workers. `expect` checks one bad call; afterwards
    the worker's own `healthy(what)` runs a correct collective, which would
    hang or abort had any rank entered a collective for the bad call."""

    def expect(self, exc, text, what, fn, *args, untouched=(), **kwargs):
        """`fn` raises `exc` mentioning `text`; the NdArrays in `untouched`
        keep their dtype and values; then the communicator still works."""
        before = [(x, x.dtype, np.array(x.data)) for x in untouched]
        self.ck.raises(exc, text, what, fn, *args, **kwargs)
        for i, (x, dt, values) in enumerate(before):
            self.ck.array(x, values, f"{what}: argument array {i} unchanged",
                          dt)
        self.healthy(what)


def three_layer_mlp(seed):
    """A 6-9-8-2 tanh MLP with a squared-error loss, parameters seeded:
    returns (x, t, loss, names, variables)."""
    import nnabla.functions as F
    import nnabla.parametric_functions as PF
    np.random.seed(seed)
    x, t = nn.Variable((3, 6)), nn.Variable((3, 2))
    h = F.tanh(PF.affine(x, 9, name="a"))
    h = F.tanh(PF.affine(h, 8, name="b"))
    loss = F.mean(F.squared_error(PF.affine(h, 2, name="c"), t))
    params = nn.get_parameters()
    return x, t, loss, list(params), list(params.values())


def mlp(scope, batch, seed, total=False):
    """The 6-9-8-2 tanh MLP with a squared-error loss in parameter scope
    `scope`: its input, target, loss and parameters. `total`: the loss sums
    over the batch instead of averaging; weights drawn from `seed`."""
    import nnabla.functions as F
    import nnabla.parametric_functions as PF
    np.random.seed(seed)
    with nn.parameter_scope(scope):
        x, t = nn.Variable((batch, 6)), nn.Variable((batch, 2))
        h = F.tanh(PF.affine(x, 9, name="a"))
        h = F.tanh(PF.affine(h, 8, name="b"))
        err = F.squared_error(PF.affine(h, 2, name="c"), t)
        loss = F.sum(err) if total else F.mean(err)
        params = nn.get_parameters()
    return x, t, loss, params


class GradientWriter(PythonFunction):
    """A function of two inputs whose backward calls `write(i, grad)` for
    each input i, to write its gradient as a test wants it (nnabla's own
    callback test writes constants cast to another dtype); its output is
    zeros shaped as the first input."""

    def __init__(self, ctx, write):
        super().__init__(ctx)
        self.write = write

    @property
    def name(self):
        return "GradientWriter"

    def min_outputs(self):
        return 1

    def grad_depends_output_data(self, i, o):
        return False

    def grad_depends_input_data(self, i, j):
        return False

    def setup_impl(self, inputs, outputs):
        outputs[0].reset_shape(inputs[0].shape, True)

    def forward_impl(self, inputs, outputs):
        outputs[0].data.fill(0)

    def backward_impl(self, inputs, outputs, propagate_down, accum):
        for i, v in enumerate(inputs):
            self.write(i, v.grad)


def share_gradients(first, second):
    """Makes the gradients of the Variables `first` and `second` narrowed
    views of one array (first's elements, then second's)."""
    shared = nn.NdArray((first.size + second.size,))
    first.grad = shared.narrow(0, 0, first.size).view(first.shape)
    second.grad = shared.narrow(0, first.size, second.size).view(
        second.shape)
