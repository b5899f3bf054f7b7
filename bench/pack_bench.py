"""Bucket packing on the GPU: nncomm's CUDA packer against cudaMemcpyAsync.

Needs an NVIDIA GPU, CuPy and ``nncomm.packing`` built with CUDA; nnabla
and MPI are not needed. From the repository root:

    NNCOMM_MPI=0 NNCOMM_CUDA=1 python3 setup.py build_ext --inplace
    python3 bench/pack_bench.py
    python3 bench/pack_bench.py --sets resnet50 --cases f32-f32 f16-f16

Two sets of tensors, each allocated separately (as a framework allocates
parameters and gradients) and packed whole, in order, into one bucket:

- ``resnet50``: ResNet-50's 161 parameter arrays (53 conv weights, 53 batch
  norm gammas and 53 betas, fc weight 1000x2048 and bias; 25,557,032 values),
  many of them small;
- ``matrices``: 8 matrices of 2048x2048 (33,554,432 values).

Cases, tensor dtype - wire dtype: ``f32-f32``, ``f16-f16`` and
``bf16-bf16`` (scale 1: the packer's word-copy kernel); ``f32-f32/2``,
packed at scale 1 and unpacked with divisor 2 (the mean of two ranks: the
general kernel's arithmetic on the same bytes); ``f32-f16`` and
``f32-bf16``, packed with scale 1/8 and unpacked with scale 8 and divisor 2.
bfloat16 tensors are held by CuPy as uint16 bit patterns.

For each set and case it times four methods, all on one non-blocking
stream:

- ``memcpy x1``: one ``cudaMemcpyAsync`` device-to-device of the bucket's
  bytes, from a separate buffer into the bucket (the ceiling);
- ``memcpy xN``: one ``cudaMemcpyAsync`` per tensor into its place in the
  bucket (the per-tensor baseline: one launch per gradient, as nnabla does);
  in ``f32-f16`` each copies the bytes of its float16 slot, so the bytes
  match the bucket's, though the values are meaningless;
- ``pack``: ``CudaPacker.pack`` (one kernel launch for all tensors);
- ``unpack``: ``CudaPacker.unpack`` (one launch).

The packer gets the same segment list every call, so its device-side table
is uploaded once and then reused, as in training. A timing is a pair of CUDA
events around K back-to-back calls, divided by K (K is chosen so that a pair
spans about 2 ms, or set by ``--reps``); ``best`` and ``median`` are over
``--iters`` pairs per method, after ``--warmup`` untimed calls, the methods
taking turns pair by pair. Each method is timed two ways:

- ``issued``: the calls go out from Python as fast as it can issue them; when
  issuing a call takes longer than the GPU's work (``host us``, the CPU time
  per call, is then close to the time), this is the host's speed;
- ``gpu``: a one-thread "gate" kernel holds the stream until all Kq calls of
  the pair are issued (at most 256 operations, below the launch queue's
  depth), so the events see the GPU's work alone, back to back.

Throughput: ``GB/s`` is the bucket's bytes (what ``memcpy x1`` copies) over
the ``gpu`` best time, the same bytes for every method, so ratios of GB/s are
ratios of time. ``DRAM GB/s`` counts what each method reads plus writes (2x
the bucket for a copy; in ``f32-f16`` pack reads 4 bytes and writes 2 per
value, so it cannot reach more than about 2/3 of the copy's GB/s there). The
sets are larger than the H200's L2 cache.

Ratios (best times): ``pack/mc`` and ``unpack/mc`` are the packer's throughput
over one memcpy's (goal >= 0.90 in the same-dtype cases); ``pk DRAM`` and ``up DRAM`` are
their DRAM bytes per second over memcpy's (goal >= 0.85 in the converting
cases, where they move other bytes than a copy); ``speed-up`` is
``memcpy xN``'s time over pack's and over unpack's, the slower of the two
(goal >= 5x on ``resnet50``). The goals are judged on ``gpu`` times; the
``issued`` ratios are printed beside them.

Before timing, each case checks the results against CuPy: the packed bucket
against ``(x * scale).astype(wire)``, and unpack(pack(x)) against x (exact in
the same-dtype cases), once with the tensors as they are and once with the
largest one split into two segments and all segments in reverse order; pack
there waits on an event recorded on another stream after that stream wrote
the tensors. The script exits 1 when a check fails; a missed goal is
reported, not an error.
"""
import argparse
import datetime
import importlib
import importlib.util
import math
import statistics
import sys
import time
from pathlib import Path

ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
# How CuPy holds each dtype (it has no bfloat16).
STORAGE = {"float32": "float32", "float16": "float16", "bfloat16": "uint16"}
# Relative size of half a unit in the last place: one rounding step.
ULP = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
TARGET_BLOCK_S = 2e-3   # GPU time one pair of events should span
MAX_REPS = 2000
QUEUE_OPS = 256         # operations held behind the gate at most
GATE_TIMEOUT_S = 2.0
GOAL_VS_MEMCPY = 0.90
GOAL_DRAM = 0.85
GOAL_SPEEDUP = 5.0

# tensor dtype, wire dtype, pack scale, unpack scale, unpack divisor
CASES = {
    "f32-f32": ("float32", "float32", 1.0, 1.0, 1),
    "f16-f16": ("float16", "float16", 1.0, 1.0, 1),
    "bf16-bf16": ("bfloat16", "bfloat16", 1.0, 1.0, 1),
    "f32-f32/2": ("float32", "float32", 1.0, 1.0, 2),
    "f32-f16": ("float32", "float16", 0.125, 8.0, 2),
    "f32-bf16": ("float32", "bfloat16", 0.125, 8.0, 2),
}
SETS = ("resnet50", "matrices")

GATE_SOURCE = r"""
extern "C" __global__ void gate(volatile int* flag,
                                unsigned long long timeout_ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    while (flag[0] == 0) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start > timeout_ns) {
            flag[1] = 1;
            return;
        }
    }
}
"""


def resnet50_shapes():
    """ResNet-50's parameter arrays in definition order (torchvision layout:
    convolutions without bias, each followed by a batch norm's gamma and
    beta; bottleneck blocks [3, 4, 6, 3] of widths 64..512, expansion 4, a
    1x1 projection in the first block of each stage; fc 2048 -> 1000)."""
    shapes = []

    def conv_bn(cout, cin, k):
        shapes.append((cout, cin, k, k))   # conv weight
        shapes.append((cout,))             # bn gamma
        shapes.append((cout,))             # bn beta

    conv_bn(64, 3, 7)
    cin = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            conv_bn(width, cin, 1)
            conv_bn(width, width, 3)
            conv_bn(4 * width, width, 1)
            if b == 0:
                conv_bn(4 * width, cin, 1)   # projection shortcut
            cin = 4 * width
    shapes.append((1000, 2048))   # fc weight
    shapes.append((1000,))        # fc bias
    assert sum(len(s) == 4 for s in shapes) == 53
    assert len(shapes) == 53 + 2 * 53 + 2 == 161, len(shapes)
    assert sum(math.prod(s) for s in shapes) == 25_557_032
    return shapes


def set_shapes(name):
    if name == "resnet50":
        return resnet50_shapes()
    return [(2048, 2048)] * 8


def import_packing():
    """nncomm.packing, from the installed package or this checkout's
    python/ folder (where ``build_ext --inplace`` puts it)."""
    if importlib.util.find_spec("nncomm") is None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
    try:
        return importlib.import_module("nncomm.packing")
    except ImportError as exc:
        sys.exit(f"pack_bench: cannot import nncomm.packing ({exc}); build "
                 "it first (see the docstring)")


def bucket_layout(packing, segments, wire):
    """(element offsets of the segments in the bucket, bucket bytes)."""
    offsets, total = packing.layout(segments, wire)
    return offsets, total * ITEMSIZE[wire]


def gpu_info(cupy):
    rt = cupy.cuda.runtime
    props = rt.getDeviceProperties(cupy.cuda.Device().id)
    name = props.get("name", b"?")
    name = name.decode(errors="replace") if isinstance(name, bytes) else name

    def version(v):
        return f"{v // 1000}.{v % 1000 // 10}"

    peak = ""
    if props.get("memoryClockRate") and props.get("memoryBusWidth"):
        tbps = (2 * props["memoryClockRate"] * 1e3
                * props["memoryBusWidth"] / 8 / 1e12)
        peak = f", DRAM {tbps:.2f} TB/s by clock x width"
    return (f"{name} (sm_{props.get('major', '?')}{props.get('minor', '?')}, "
            f"{props.get('multiProcessorCount', '?')} SMs, "
            f"{props.get('totalGlobalMem', 0) / 2**30:.0f} GiB{peak}); "
            f"CUDA runtime {version(rt.runtimeGetVersion())}, "
            f"driver {version(rt.driverGetVersion())}, CuPy {cupy.__version__}")


class Gate:
    """Holds a stream (a one-thread kernel spinning on a flag in pinned host
    memory) until the host opens it, so that work issued meanwhile runs back
    to back. Gives up after GATE_TIMEOUT_S, noting it, so that a full launch
    queue cannot deadlock the host."""

    def __init__(self, cupy, numpy, stream):
        self.stream = stream
        self.kernel = cupy.RawKernel(GATE_SOURCE, "gate")
        self.memory = cupy.cuda.alloc_pinned_memory(8)
        self.flag = numpy.frombuffer(self.memory, numpy.int32, 2)
        self.flag[:] = 0
        self.args = (numpy.uint64(self.memory.ptr),
                     numpy.uint64(int(GATE_TIMEOUT_S * 1e9)))
        self.timeouts = 0
        self.close()   # compile, and check that it opens
        self.open()

    def close(self):
        self.flag[0] = 0
        self.kernel((1,), (1,), self.args, stream=self.stream)

    def open(self):
        self.flag[0] = 1
        self.stream.synchronize()
        if self.flag[1]:
            self.timeouts += 1
            self.flag[1] = 0


def to_f32(cupy, x, dtype):
    """Values of `x` (held as STORAGE[dtype]) as float32."""
    if dtype == "bfloat16":
        return (x.astype(cupy.uint32) << 16).view(cupy.float32)
    return x.astype(cupy.float32)


def from_f32(cupy, x, dtype):
    """float32 `x` rounded to nearest even into `dtype`, held as
    STORAGE[dtype] (finite values)."""
    if dtype == "bfloat16":
        bits = x.view(cupy.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(
            cupy.uint16)
    return x.astype(dtype)


def make_tensors(cupy, shapes, dtype):
    return [from_f32(cupy, cupy.random.standard_normal(shape,
                                                       dtype=cupy.float32),
                     dtype) for shape in shapes]


def close_enough(cupy, got, expected, dtype):
    """(exact, within one rounding step of `dtype`): allows a rounding step
    from the reference's; NaN (an element left unwritten) fails both."""
    if cupy.array_equal(got, expected):
        return True, True
    g, e = to_f32(cupy, got, dtype), to_f32(cupy, expected, dtype)
    tol = cupy.abs(e) * ULP.get(dtype, 0.0) + 2.0 ** -24
    return False, bool(cupy.all(cupy.abs(g - e) <= tol))


def check(cupy, packing, tensors, segments, case, stream, side):
    """Packs, then unpacks into NaN-filled tensors; compares both to CuPy.
    Returns 'exact', 'within 1 ulp' or 'FAIL: ...'; leaves the tensors as
    they were."""
    src, wire, pack_scale, unpack_scale, divisor = CASES[case]
    refs = [t.copy() for t in tensors]
    offsets, nbytes = bucket_layout(packing, segments, wire)
    bucket = cupy.full(nbytes, 0xFF, dtype=cupy.uint8)   # NaN everywhere
    words = bucket.view(STORAGE[wire])
    index = {t.data.ptr: i for i, t in enumerate(tensors)}
    # A first call uploads the table (allocating, which may synchronize the
    # device), so that the call checked below shows its own event wait.
    packer = packing.CudaPacker()
    packer.pack(segments, bucket.data.ptr, wire, stream=stream.ptr)
    stream.synchronize()
    bucket.fill(0xFF)
    for t in tensors:
        t.view(cupy.uint8).fill(0xFF)
    cupy.cuda.Device().synchronize()
    # The data arrives on another stream; pack must wait for its event.
    with side:
        for t, r in zip(tensors, refs):
            t[...] = r
    ready = cupy.cuda.Event(disable_timing=True)
    ready.record(side)
    packer.pack(segments, bucket.data.ptr, wire, scale=pack_scale,
                stream=stream.ptr, event=ready.ptr)
    stream.synchronize()
    side.synchronize()
    exact, ok = True, True
    packed = []
    for (addr, _, start, count), off in zip(segments, offsets):
        x = refs[index[addr]].ravel()[start:start + count]
        want = from_f32(cupy, to_f32(cupy, x, src)
                        * cupy.float32(pack_scale), wire)
        e, o = close_enough(cupy, words[off:off + count], want, wire)
        exact, ok = exact and e, ok and o
        packed.append(want)
    if not ok:
        return "FAIL: pack differs from the CuPy reference"
    for t in tensors:
        t.view(cupy.uint8).fill(0xFF)
    cupy.cuda.Device().synchronize()
    packer.unpack(segments, bucket.data.ptr, wire, scale=unpack_scale,
                  divisor=divisor, stream=stream.ptr)
    stream.synchronize()
    factor = cupy.float32(unpack_scale / divisor)
    expected = [r.copy() for r in refs]
    for (addr, _, start, count), want in zip(segments, packed):
        flat = expected[index[addr]].reshape(-1)   # a view of the copy
        flat[start:start + count] = from_f32(
            cupy, to_f32(cupy, want, wire) * factor, src)
    for t, want in zip(tensors, expected):
        e, o = close_enough(cupy, t, want, src)
        exact, ok = exact and e, ok and o
    for t, r in zip(tensors, refs):
        t[...] = r
    cupy.cuda.Device().synchronize()
    if not ok:
        return "FAIL: unpack(pack(x)) differs from the reference"
    if not exact and src == wire:
        return "FAIL: same-dtype round trip is not exact"
    return "exact" if exact else "within 1 ulp"


def split_segments(tensors, src):
    """The tensors as segments in reverse order, the largest cut in two."""
    big = max(range(len(tensors)), key=lambda i: tensors[i].size)
    segments = []
    for i, t in enumerate(tensors):
        if i == big:
            half = t.size // 2 + 1
            segments.append((t.data.ptr, src, 0, half))
            segments.append((t.data.ptr, src, half, t.size - half))
        else:
            segments.append((t.data.ptr, src, 0, t.size))
    return segments[::-1]


def measure(cupy, methods, stream, gate, args):
    """methods: {name: (fn, stream operations per call)}. Returns
    {name: {"k", "best", "median", "host", "kq", "gpu_best", "gpu_median"}}
    in seconds per call (the gpu entries None without a gate)."""
    ks, kqs = {}, {}
    for name, (fn, ops) in methods.items():
        for _ in range(args.warmup):
            fn()
        stream.synchronize()
        if args.reps > 0:
            k = args.reps
        else:
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            for _ in range(3):
                fn()
            end.record(stream)
            end.synchronize()
            one = cupy.cuda.get_elapsed_time(start, end) / 1e3 / 3
            k = math.ceil(TARGET_BLOCK_S / max(one, 1e-7))
        ks[name] = max(1, min(MAX_REPS, k))
        kqs[name] = max(1, min(ks[name], QUEUE_OPS // ops))
    issued = {name: [] for name in methods}
    queued = {name: [] for name in methods}
    host = {name: [] for name in methods}
    for _ in range(args.iters):
        for name, (fn, _) in methods.items():
            k = ks[name]
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            t0 = time.perf_counter()
            start.record(stream)
            for _ in range(k):
                fn()
            end.record(stream)
            host[name].append((time.perf_counter() - t0) / k)
            issued[name].append((start, end))
        stream.synchronize()
        if gate is None:
            continue
        for name, (fn, _) in methods.items():
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            gate.close()
            start.record(stream)
            for _ in range(kqs[name]):
                fn()
            end.record(stream)
            gate.open()   # and waits for the stream
            queued[name].append((start, end))
    out = {}
    for name in methods:
        times = [cupy.cuda.get_elapsed_time(s, e) / 1e3 / ks[name]
                 for s, e in issued[name]]
        r = {"k": ks[name], "best": min(times),
             "median": statistics.median(times),
             "host": statistics.median(host[name]), "kq": kqs[name],
             "gpu_best": None, "gpu_median": None}
        if gate is not None:
            times = [cupy.cuda.get_elapsed_time(s, e) / 1e3 / kqs[name]
                     for s, e in queued[name]]
            r["gpu_best"] = min(times)
            r["gpu_median"] = statistics.median(times)
        out[name] = r
    return out


def run_case(cupy, packing, set_name, case, args, stream, side, gate):
    src, wire, pack_scale, unpack_scale, divisor = CASES[case]
    tensors = make_tensors(cupy, set_shapes(set_name), src)
    n = len(tensors)
    values = sum(t.size for t in tensors)
    segments = [(t.data.ptr, src, 0, t.size) for t in tensors]

    status = check(cupy, packing, tensors, split_segments(tensors, src),
                   case, stream, side)
    if not status.startswith("FAIL"):
        status = check(cupy, packing, tensors, segments, case, stream, side)

    offsets, nbytes = bucket_layout(packing, segments, wire)
    w = ITEMSIZE[wire]
    payload = values * w
    bucket = cupy.zeros(nbytes, dtype=cupy.uint8)
    scratch = cupy.zeros(nbytes, dtype=cupy.uint8)
    # Written on the null stream, which a non-blocking stream does not wait
    # for.
    cupy.cuda.Device().synchronize()
    base, scratch_ptr, sp = bucket.data.ptr, scratch.data.ptr, stream.ptr
    copies = [(base + off * w, t.data.ptr, t.size * w)
              for t, off in zip(tensors, offsets)]
    packer = packing.CudaPacker()
    memcpy = cupy.cuda.runtime.memcpyAsync
    d2d = cupy.cuda.runtime.memcpyDeviceToDevice

    def memcpy_one():
        memcpy(base, scratch_ptr, nbytes, d2d, sp)

    def memcpy_each():
        for dst, s, size in copies:
            memcpy(dst, s, size, d2d, sp)

    def pack():
        packer.pack(segments, base, wire, scale=pack_scale, stream=sp)

    flags = cupy.zeros(len(segments), dtype=cupy.uint32)

    def pack_checked():
        packer.pack(segments, base, wire, scale=pack_scale, stream=sp,
                    flags=flags.data.ptr)

    def unpack():
        packer.unpack(segments, base, wire, scale=unpack_scale,
                      divisor=divisor, stream=sp)

    each = f"memcpy x{n}"
    # A packer call on a table it holds is 3 stream operations: a wait for
    # its previous work, the kernel and an event record.
    methods = {"memcpy x1": (memcpy_one, 1), each: (memcpy_each, n),
               "pack": (pack, 3), "unpack": (unpack, 3)}
    dram = {"memcpy x1": 2 * nbytes, each: 2 * payload,
            "pack": values * (ITEMSIZE[src] + w),
            "unpack": values * (ITEMSIZE[src] + w)}
    if args.check_finite:
        methods["pack chk"] = (pack_checked, 3)
        dram["pack chk"] = dram["pack"]
    res = measure(cupy, methods, stream, gate, args)
    del bucket, scratch   # freed once the caller empties the pool

    scaling = (f" (pack scale {pack_scale:g}, unpack scale {unpack_scale:g} "
               f"/ {divisor})"
               if (pack_scale, unpack_scale, divisor) != (1.0, 1.0, 1) else "")
    print(f"\n## {set_name} {case}: {n} tensors, {values:,} values, "
          f"{src} -> wire {wire}{scaling}; bucket {nbytes / 1e6:.1f} MB "
          f"({nbytes - payload} bytes of padding); "
          f"check: {status}")
    print(f"{'':<12} {'issued':>37} | {'gpu':>27}")
    print(f"{'method':<12} {'K':>5} {'best us':>9} {'median us':>10} "
          f"{'host us':>9} | {'Kq':>4} {'best us':>9} {'median us':>10} "
          f"{'GB/s':>8} {'DRAM GB/s':>10}")
    gpu = gate is not None
    for name, r in res.items():
        t = r["gpu_best"] if gpu else r["best"]
        line = (f"{name:<12} {r['k']:>5} {r['best'] * 1e6:>9.1f} "
                f"{r['median'] * 1e6:>10.1f} {r['host'] * 1e6:>9.1f} | ")
        if gpu:
            line += (f"{r['kq']:>4} {r['gpu_best'] * 1e6:>9.1f} "
                     f"{r['gpu_median'] * 1e6:>10.1f} ")
        else:
            line += f"{'-':>4} {'-':>9} {'-':>10} "
        line += f"{nbytes / t / 1e9:>8.1f} {dram[name] / t / 1e9:>10.1f}"
        print(line)
    if "pack chk" in res:
        key = "gpu_best" if gpu else "best"
        print(f"check_finite: pack chk / pack, best times: "
              f"{res['pack chk'][key] / res['pack'][key]:.3f}")

    def ratios(key):
        one = res["memcpy x1"][key]
        return {"pack": one / res["pack"][key],
                "unpack": one / res["unpack"][key],
                "speedup": res[each][key] / max(res["pack"][key],
                                                res["unpack"][key]),
                "pack_dram": dram["pack"] / dram["memcpy x1"]
                * one / res["pack"][key],
                "unpack_dram": dram["unpack"] / dram["memcpy x1"]
                * one / res["unpack"][key]}

    row = {"set": set_name, "case": case, "check": status,
           "same": src == wire, "issued": ratios("best"),
           "gpu": ratios("gpu_best") if gpu else None}
    for key in ("gpu", "issued"):
        r = row[key]
        if r is None:
            continue
        print(f"ratios, {key} best: pack/memcpy {r['pack']:.2f}, "
              f"unpack/memcpy {r['unpack']:.2f}, speed-up over {each} "
              f"{r['speedup']:.1f}x (the slower of pack and unpack), DRAM "
              f"GB/s over memcpy's: pack {r['pack_dram']:.2f}, unpack "
              f"{r['unpack_dram']:.2f}")
    sys.stdout.flush()
    return row


def goals(row, key):
    """'met' or 'below: ...' for the ratios row[key]."""
    r = row[key]
    missed = []
    if row["same"]:
        if r["pack"] < GOAL_VS_MEMCPY:
            missed.append("pack")
        if r["unpack"] < GOAL_VS_MEMCPY:
            missed.append("unpack")
    else:
        if r["pack_dram"] < GOAL_DRAM:
            missed.append("pack DRAM")
        if r["unpack_dram"] < GOAL_DRAM:
            missed.append("unpack DRAM")
    if row["set"] == "resnet50" and r["speedup"] < GOAL_SPEEDUP:
        missed.append("speed-up")
    return "below: " + ", ".join(missed) if missed else "met"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=30,
                        help="timed pairs of events per method and way")
    parser.add_argument("--warmup", type=int, default=5,
                        help="untimed calls per method first")
    parser.add_argument("--reps", type=int, default=0,
                        help="calls between two events (0: about 2 ms worth)")
    parser.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS))
    parser.add_argument("--cases", nargs="+", choices=list(CASES),
                        default=list(CASES))
    parser.add_argument("--check-finite", action="store_true",
                        help="also time 'pack chk': pack checking every "
                        "value for NaN and infinity as it is read "
                        "(check_finite), against 'pack'")
    parser.add_argument("--no-gate", action="store_true",
                        help="time only as issued (no gate kernel)")
    args = parser.parse_args()
    if args.iters < 1 or args.warmup < 0 or args.reps < 0:
        parser.error("--iters must be >= 1, --warmup and --reps >= 0")

    try:
        import cupy
        import numpy
    except ImportError as exc:
        sys.exit(f"pack_bench: needs CuPy and an NVIDIA GPU ({exc})")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
        cupy.cuda.Device(0).use()
        info = gpu_info(cupy)
    except Exception as exc:   # CUDARuntimeError without a driver or device
        sys.exit(f"pack_bench: no usable GPU: {exc}")
    packing = import_packing()
    if not getattr(packing, "cuda_built", False):
        sys.exit("pack_bench: nncomm.packing was built without CUDA "
                 "(packing.cuda_built is False); rebuild it where nvcc is, "
                 "with NNCOMM_CUDA=1")

    stream = cupy.cuda.Stream(non_blocking=True)
    side = cupy.cuda.Stream(non_blocking=True)
    gate, gate_note = None, "off (--no-gate)"
    if not args.no_gate:
        try:
            gate = Gate(cupy, numpy, stream)
            gate_note = "on"
        except Exception as exc:   # no NVRTC, say
            gate_note = f"unavailable ({type(exc).__name__}: {exc})"
        if gate is not None and gate.timeouts:
            gate, gate_note = None, "unavailable (did not open)"

    now = datetime.datetime.now().astimezone()
    print(f"# {now.isoformat(timespec='seconds')}")
    print(f"# GPU: {info}")
    print(f"# packer: {getattr(packing, '__file__', '?')}, tile "
          f"{packing.TILE_BYTES} bytes")
    print(f"# {args.iters} timed pairs of events per method and way, methods "
          f"taking turns; {args.warmup} warm-up calls; K calls per pair "
          + (f"= {args.reps}" if args.reps else "for about 2 ms")
          + f"; one non-blocking stream; gate {gate_note}")
    cupy.random.seed(0)
    rows = []
    for set_name in args.sets:
        for case in args.cases:
            rows.append(run_case(cupy, packing, set_name, case, args,
                                 stream, side, gate))
            cupy.get_default_memory_pool().free_all_blocks()

    key = "gpu" if gate is not None else "issued"
    print(f"\n# summary, best times: pack/mc and unpack/mc are throughput "
          f"over one memcpy's (goal >= {GOAL_VS_MEMCPY:.2f} in same-dtype "
          f"cases), pk/up DRAM their DRAM bytes per second over memcpy's "
          f"(goal >= {GOAL_DRAM:.2f} in converting cases), speed-up is "
          f"per-tensor memcpys' time over the slower of pack and unpack "
          f"(goal >= {GOAL_SPEEDUP:g}x on resnet50); goals judged on {key} "
          f"times")
    cols = ("pack/mc", "unpack/mc", "pk DRAM", "up DRAM", "speed-up")
    width = sum(len(c) + 1 for c in cols)
    print(f"{'':<19} {'gpu':>{width}}   {'issued':>{width}}")
    print(f"{'set':<9} {'case':<9} "
          + (" ".join(cols) + "   ") * 2 + f"{'check':<13} goals")
    for r in rows:
        line = f"{r['set']:<9} {r['case']:<9} "
        for k in ("gpu", "issued"):
            x = r[k]
            values = ([None] * 5 if x is None else
                      [x["pack"], x["unpack"], x["pack_dram"],
                       x["unpack_dram"], x["speedup"]])
            for c, v in zip(cols, values):
                line += (f"{'-':>{len(c)}} " if v is None else
                         f"{v:>{len(c) - 1}.1f}x " if c == "speed-up" else
                         f"{v:>{len(c)}.2f} ")
            line += "  "
        print(line + f"{r['check']:<13} {goals(r, key)}")
    if gate is not None and gate.timeouts:
        print(f"# warning: the gate gave up {gate.timeouts} time(s) after "
              f"{GATE_TIMEOUT_S:g} s (a full launch queue?); those gpu "
              f"times include issuing")
    if any(r["check"].startswith("FAIL") for r in rows):
        sys.exit("pack_bench: a correctness check failed (see above)")


if __name__ == "__main__":
    main()
