"""nncomm.packing.CudaPacker on a GPU: every result must be bit for bit what
the host twin (packing.pack / packing.unpack on host copies of the same
data) gives, for float32, float16 and bfloat16 (held as uint16 bit
patterns); float16/bfloat16 results also stay within their rounding bound
of a float64 reference. Needs CuPy, a CUDA device and an nvcc build;
skipped otherwise.
"""
import numpy as np
import pytest

from packing_reference import (DIVISORS, GUARD, LOSSLESS, SCALES, STORAGE,
                               UINT, assert_bits, from_float, many_specs,
                               random_values, rng_for,
                               split_across_two_buckets, split_specs,
                               to_float)

pytestmark = pytest.mark.gpu

cupy = pytest.importorskip("cupy")
try:
    _DEVICES = cupy.cuda.runtime.getDeviceCount()
except Exception:  # no driver, no runtime, no device
    _DEVICES = 0
if _DEVICES == 0:
    pytest.skip("no CUDA device", allow_module_level=True)

from nncomm import packing  # noqa: E402

if not packing.cuda_built:
    pytest.skip("nncomm.packing was built without nvcc",
                allow_module_level=True)

DEVICE = ["float32", "float16", "bfloat16"]
# Elements per tile of rows with a float32 side, and of 16-bit rows in a
# 16-bit bucket.
TILE4, TILE2 = packing.TILE_BYTES // 4, packing.TILE_BYTES // 2


# --- values ------------------------------------------------------------------

def to_f64(x, dtype):
    return to_float(x, dtype).astype(np.float64)


def synchronize():
    cupy.cuda.Device().synchronize()


# --- tensors on both sides ---------------------------------------------------

class Mirrored:
    """`n` elements at element `shift` of an array held twice, on the host
    (`host`) and on the device (`dev`)."""

    def host_view(self):
        return self.host[self.shift:self.shift + self.n]

    def dev_view(self):
        return self.dev[self.shift:self.shift + self.n]

    def check(self, what):
        """The whole arrays, padding included, agree bit for bit."""
        assert_bits(self.dev.get(), self.host, what)


class Tensor(Mirrored):
    """`n` elements of `dtype` at element `shift` of a larger random array,
    once on the host and once (the same bits) on the device."""

    def __init__(self, n, dtype, rng, shift=0, pad=3):
        self.n, self.dtype, self.shift = n, dtype, shift
        self.host = random_values(shift + n + pad, dtype, rng)
        self.dev = cupy.asarray(self.host)


def segments(specs, side):
    """specs: (Tensor or None, dtype, offset, count) -> the API's tuples
    for the host ("host") or device ("dev") copies; None is address 0."""
    out = []
    for t, dt, off, c in specs:
        if t is None:
            out.append((0, dt, off, c))
        elif side == "host":
            out.append((t.host_view().ctypes.data, dt, off, c))
        else:
            out.append((t.dev_view().data.ptr, dt, off, c))
    return out


class Bucket(Mirrored):
    """A bucket of `n` wire elements at element `shift` of an array, on
    both sides, GUARD elements of it after the bucket; 0xA5 bytes unless
    given random content."""

    def __init__(self, n, wire, shift=1, rng=None):
        self.n, self.shift = n, shift
        self.host = np.empty(shift + n + GUARD, STORAGE[wire])
        self.host.view(np.uint8)[:] = 0xA5
        if rng is not None:
            self.host[shift:shift + n] = random_values(n, wire, rng)
        self.dev = cupy.asarray(self.host)

    @property
    def host_address(self):
        return self.host[self.shift:].ctypes.data

    @property
    def dev_address(self):
        return self.dev[self.shift:].data.ptr


def total_of(specs):
    return sum(c for *_, c in specs)


def twin_pack(packer, specs, wire, scale=1.0, shift=1, stream=0, event=0,
              bucket=None):
    """Packs `specs` on both sides into `bucket` (by default a fresh one);
    checks they agree (guard included) and that the sources are unchanged.
    With a bucket given, it neither synchronizes nor checks: the caller
    does, on its stream."""
    given = bucket is not None
    if not given:
        bucket = Bucket(total_of(specs), wire, shift)
        synchronize()
    packing.pack(segments(specs, "host"), bucket.host_address, wire,
                 scale=scale)
    packer.pack(segments(specs, "dev"), bucket.dev_address, wire,
                scale=scale, stream=stream, event=event)
    if not given:
        synchronize()
        bucket.check(f"pack into {wire}, scale {scale}")
        for t in {id(t): t for t, *_ in specs if t is not None}.values():
            t.check("pack left its source alone")
    return bucket


def twin_unpack(packer, specs, bucket, wire, scale=1.0, divisor=1, stream=0,
                event=0):
    """Unpacks `bucket` (both sides) into `specs`; checks every destination
    array agrees with the host twin, and the bucket is unchanged."""
    tensors = {id(t): t for t, *_ in specs if t is not None}
    packing.unpack(segments(specs, "host"), bucket.host_address, wire,
                   scale=scale, divisor=divisor)
    synchronize()
    packer.unpack(segments(specs, "dev"), bucket.dev_address, wire,
                  scale=scale, divisor=divisor, stream=stream, event=event)
    synchronize()
    for t in tensors.values():
        t.check(f"unpack {wire} into {t.dtype}, scale {scale}, "
                f"divisor {divisor}")
    bucket.check("unpack left the bucket alone")


@pytest.fixture(scope="module")
def packer():
    return packing.CudaPacker()


# --- every (source, wire) pair -----------------------------------------------

@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("wire", DEVICE)
@pytest.mark.parametrize("src", DEVICE)
def test_pack_matches_host(packer, src, wire, scale):
    specs = split_specs(Tensor, rng_for("pack", src, wire, scale), src)
    twin_pack(packer, specs, wire, scale)


@pytest.mark.parametrize("divisor", DIVISORS)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dst", DEVICE)
@pytest.mark.parametrize("wire", DEVICE)
def test_unpack_matches_host(packer, wire, dst, scale, divisor):
    rng = rng_for("unpack", wire, dst, scale, divisor)
    specs = split_specs(Tensor, rng, dst)
    bucket = Bucket(total_of(specs), wire, shift=3, rng=rng)
    twin_unpack(packer, specs, bucket, wire, scale, divisor)


@pytest.mark.parametrize("wire", DEVICE)
def test_mixed_dtypes_in_one_bucket(packer, wire):
    rng = rng_for("mixed", wire)
    specs = []
    for dt in DEVICE:
        specs += split_specs(Tensor, rng, dt, [3, 1023, 4097])
    rng.shuffle(specs)
    twin_pack(packer, specs, wire, 0.5)
    bucket = Bucket(total_of(specs), wire, rng=rng)
    twin_unpack(packer, specs, bucket, wire, -1.25, 3)


ODD_SIZES = sorted({1, 2, 3, 5, 7, 8, 9, 15, 17, 31, 33, 127, 129, 1023,
                    4097, 65537, TILE4 - 1, TILE4, TILE4 + 1, 3 * TILE4 + 5,
                    TILE2 - 1, TILE2 + 1, 2 * TILE2 + 3, (1 << 20) + 3})


@pytest.mark.parametrize("wire", DEVICE)
@pytest.mark.parametrize("n", ODD_SIZES)
def test_odd_sizes_at_odd_addresses(packer, n, wire):
    """Sizes around vector widths and the tile size, at device addresses
    that are views at odd element offsets (`arr[1:].data.ptr`)."""
    rng = rng_for("odd", n, wire)
    for shift in (0, 1, 3):
        src = DEVICE[(n + shift) % 3]
        t = Tensor(n, src, rng, shift=shift)
        twin_pack(packer, [(t, src, 0, n)], wire, 3.0, shift=(shift + 1) % 4)
        bucket = Bucket(n, wire, shift=(shift + 2) % 4, rng=rng)
        twin_unpack(packer, [(t, src, 0, n)], bucket, wire, 0.5, 3)


def test_misaligned_views(packer):
    """Tensors and buckets at arr[1:] (2-byte aligned for 16-bit dtypes,
    4-byte for float32), several segments starting at odd offsets."""
    rng = rng_for("views")
    for src in DEVICE:
        for wire in DEVICE:
            t = Tensor(1001, src, rng, shift=1)
            specs = [(t, src, 1, 333), (t, src, 334, 1), (t, src, 335, 665)]
            twin_pack(packer, specs, wire, -1.25, shift=1)
            bucket = Bucket(999, wire, shift=1, rng=rng)
            twin_unpack(packer, specs, bucket, wire, 1.0, 7)


# --- rounding bound against float64 ------------------------------------------

BOUNDS = {"float16": (2.0**-11, 2.0**-14, 65504.0),
          "bfloat16": (2.0**-8, 2.0**-126, 3.3895313892515355e38)}


@pytest.mark.parametrize("narrow", ["float16", "bfloat16"])
def test_rounding_within_bound(packer, narrow):
    """Within the normal range, float16 results are within 2**-11 and
    bfloat16 within 2**-8 (relative) of x * scale / divisor computed in
    float64; the small extra allowance is the float32 intermediate's own
    rounding."""
    unit, smallest, largest = BOUNDS[narrow]
    rng = rng_for("bound", narrow)
    n = 100003
    for scale, divisor in [(1.0, 1), (0.5, 3), (3.0, 7), (-1.25, 2)]:
        t = Tensor(n, "float32", rng, shift=1)
        bucket = twin_pack(packer, [(t, "float32", 0, n)], narrow, scale)
        checks = [(to_f64(bucket.dev_view().get(), narrow),
                   to_f64(t.host_view(), "float32") * scale)]
        source = Bucket(n, "float32", rng=rng)
        d = Tensor(n, narrow, rng, shift=1)
        twin_unpack(packer, [(d, narrow, 0, n)], source, "float32", scale,
                    divisor)
        checks.append((to_f64(d.dev_view().get(), narrow),
                       to_f64(source.host_view(), "float32") * scale /
                       divisor))
        for got, ref in checks:
            normal = (np.abs(ref) >= smallest) & (np.abs(ref) <= largest)
            assert normal.sum() > n // 2
            err = np.abs(got[normal] - ref[normal])
            bound = (unit + 2.0**-20) * np.abs(ref[normal])
            worst = np.argmax(err / bound)
            assert (err <= bound).all(), (
                f"{narrow}, scale {scale}, divisor {divisor}: "
                f"{ref[normal][worst]!r} became {got[normal][worst]!r}")


# --- streams and events ------------------------------------------------------

_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""
SPIN_CYCLES = 600_000_000  # a few hundred milliseconds


def spin(stream):
    kernel = cupy.RawKernel(_SPIN, "spin")
    with stream:
        kernel((1,), (1,), (np.int64(SPIN_CYCLES),))


def warm(packer, specs, bucket, wire, unpack=False):
    """Calls the packer once with `specs` and waits, so that the call under
    test finds its table on the device: uploading a new table allocates
    memory, which may synchronize the device and so hide a missing wait."""
    move = packer.unpack if unpack else packer.pack
    move(segments(specs, "dev"), bucket.dev_address, wire)
    synchronize()


def write_late(m, values, stream):
    """Gives Mirrored `m` new values: on the host at once, on the device
    only behind a long kernel on `stream`. Returns the event recorded after
    the device write, which the stream has not reached yet."""
    # Kept alive until the stream has copied it: freed, CuPy's pool could
    # hand it to an allocation that the stream's copy does not wait for.
    m.incoming = cupy.asarray(values)
    m.host_view()[:] = values
    synchronize()
    spin(stream)
    with stream:
        m.dev_view()[...] = m.incoming
    event = cupy.cuda.Event()
    event.record(stream)
    assert not event.done, "the writer finished too soon to show anything"
    return event


@pytest.mark.parametrize("wire", DEVICE)
def test_pack_waits_for_the_event_on_its_stream(packer, wire):
    """The source is written on another stream after a long kernel; pack on
    a third stream, given the event recorded after the write, must see the
    new values."""
    rng = rng_for("event pack", wire)
    writer = cupy.cuda.Stream(non_blocking=True)
    stream = cupy.cuda.Stream(non_blocking=True)
    t = Tensor(40000, "float32", rng, shift=1)
    new = random_values(t.n, "float32", rng)
    specs = [(t, "float32", 0, 20000), (t, "float32", 20000, 20000)]
    bucket = Bucket(t.n, wire, shift=1)
    warm(packer, specs, bucket, wire)
    event = write_late(t, new, writer)
    twin_pack(packer, specs, wire, 0.5, stream=stream.ptr, event=event.ptr,
              bucket=bucket)
    stream.synchronize()
    bucket.check("pack after the event")
    writer.synchronize()


@pytest.mark.parametrize("dst", DEVICE)
def test_unpack_waits_for_the_event_on_its_stream(packer, dst):
    rng = rng_for("event unpack", dst)
    writer = cupy.cuda.Stream(non_blocking=True)
    stream = cupy.cuda.Stream(non_blocking=True)
    n = 40000
    bucket = Bucket(n, "float32", shift=1)
    new = random_values(n, "float32", rng)
    d = Tensor(n, dst, rng, shift=1)
    specs = [(d, dst, 0, n)]
    warm(packer, specs, bucket, "float32", unpack=True)
    event = write_late(bucket, new, writer)
    packing.unpack(segments(specs, "host"), bucket.host_address, "float32",
                   scale=3.0, divisor=3)
    packer.unpack(segments(specs, "dev"), bucket.dev_address, "float32",
                  scale=3.0, divisor=3, stream=stream.ptr, event=event.ptr)
    stream.synchronize()
    d.check("unpack after the event")
    writer.synchronize()


def test_work_goes_on_the_given_stream(packer):
    """A write queued on a non-blocking stream behind a long kernel, then
    pack and unpack on that same stream without an event: stream order
    alone must make them see the write (on the legacy default stream they
    would not)."""
    rng = rng_for("stream order")
    stream = cupy.cuda.Stream(non_blocking=True)
    t = Tensor(30000, "float16", rng, shift=3)
    new = random_values(t.n, "float16", rng)
    specs = [(t, "float16", 0, t.n)]
    bucket = Bucket(t.n, "bfloat16", shift=1)
    warm(packer, specs, bucket, "bfloat16")
    write_late(t, new, stream)
    twin_pack(packer, specs, "bfloat16", -1.25, stream=stream.ptr,
              bucket=bucket)
    stream.synchronize()
    bucket.check("pack in stream order")

    # And unpack, of a bucket written in the same way.
    new = random_values(t.n, "bfloat16", rng)
    d = Tensor(t.n, "float32", rng)
    specs = [(d, "float32", 0, t.n)]
    warm(packer, specs, bucket, "bfloat16", unpack=True)
    write_late(bucket, new, stream)
    packing.unpack(segments(specs, "host"), bucket.host_address, "bfloat16",
                   divisor=7)
    packer.unpack(segments(specs, "dev"), bucket.dev_address, "bfloat16",
                  divisor=7, stream=stream.ptr)
    stream.synchronize()
    d.check("unpack in stream order")


# --- one packer, many tables -------------------------------------------------

@pytest.mark.parametrize("max_tables", [256, 2])
def test_one_packer_many_tables(max_tables):
    """The same CudaPacker for many buckets whose tables differ (in length,
    addresses, offsets, counts, dtypes), coming back to earlier ones, with
    room for all their tables or for two: each result is the host twin's,
    and a changed table changes the result."""
    packer = packing.CudaPacker(max_tables=max_tables)
    rng = rng_for("tables")
    raw = {}
    cursor = [0] * 6
    for name, n in [("A", 60), ("B", 3), ("C", 3000)]:
        pieces = []
        for _ in range(n):
            k, g = int(rng.integers(6)), int(rng.integers(1, 4))
            c = int(rng.integers(1, 33))
            pieces.append((k, cursor[k] + g, c))
            cursor[k] += g + c
        raw[name] = pieces
    size = max(cursor) + 8
    pool = [Tensor(size, DEVICE[k % 3], rng, shift=k % 4) for k in range(6)]
    spare = {dt: Tensor(size, dt, rng, shift=1) for dt in DEVICE}
    tables = {name: [(pool[k], pool[k].dtype, off, c) for k, off, c in p]
              for name, p in raw.items()}
    a = tables["A"]
    t7, dt7, off7, c7 = a[7]
    t8, dt8, off8, c8 = a[8]
    other = DEVICE[(DEVICE.index(dt7) + 1) % 3]
    tables.update({
        # the same shape, one segment one element further on
        "A offset": a[:7] + [(t7, dt7, off7 + 1, c7)] + a[8:],
        # one segment in another tensor of its dtype
        "A address": a[:7] + [(spare[dt7], dt7, off7, c7)] + a[8:],
        # the same total, one element moved from one segment to the next
        "A counts": a[:7] + [(t7, dt7, off7, c7 - 1),
                             (t8, dt8, off8, c8 + 1)] + a[9:],
        # one segment of another dtype
        "A dtype": a[:7] + [(spare[other], other, off7, c7)] + a[8:],
        # with address 0 and empty segments
        "A holes": a[:7] + [(None, dt7, 0, c7), (t8, dt8, off8, 0)] + a[9:],
    })
    order = ["A", "A", "A offset", "B", "A", "C", "A address", "A counts",
             "B", "A dtype", "C", "A holes", "A", "A offset", "A"]
    for wire in DEVICE:
        for i, name in enumerate(order):
            specs = tables[name]
            twin_pack(packer, specs, wire, SCALES[i % 4])
            back = Bucket(total_of(specs), wire, rng=rng)
            twin_unpack(packer, specs, back, wire, 1.0, DIVISORS[i % 4])
        # Every variant of A packs differently from A at the same scale.
        for name in ["A offset", "A address", "A counts", "A dtype",
                     "A holes"]:
            specs = tables[name]
            got = twin_pack(packer, specs, wire).dev_view().get()
            base = twin_pack(packer, a, wire).dev_view().get()
            assert got.view(UINT[got.itemsize]).tolist() != \
                base.view(UINT[base.itemsize]).tolist(), name


# --- many segments, split tensors, holes -------------------------------------

@pytest.mark.parametrize("wire", DEVICE)
def test_ten_thousand_segments_in_one_bucket(packer, wire):
    rng = rng_for("10000", wire)
    n = 10000
    specs = many_specs(Tensor, rng, n, DEVICE, tensors=6, shifts=4)
    for i in range(0, n, 97):  # some holes: address 0
        specs[i] = (None, specs[i][1], 0, specs[i][3])
    assert len(specs) == n
    twin_pack(packer, specs, wire, 0.5)
    bucket = Bucket(total_of(specs), wire, rng=rng)
    twin_unpack(packer, specs, bucket, wire, 1.0, 3)


DEVICE_LOSSLESS = [(d, w) for d, w in LOSSLESS
                   if d in DEVICE and w in DEVICE]


@pytest.mark.parametrize("dtype,wire", DEVICE_LOSSLESS)
def test_tensor_split_across_two_buckets(packer, dtype, wire):
    """Three tensors cut across two buckets; unpacked on the device into
    fresh tensors they come back bit for bit."""
    specs, fresh_specs, pairs = split_across_two_buckets(
        Tensor, rng_for("split", dtype, wire), dtype)
    buckets = [twin_pack(packer, s, wire) for s in specs]
    for s, bucket in zip(fresh_specs, buckets):
        twin_unpack(packer, s, bucket, wire)
    for x, fresh in pairs:
        assert_bits(fresh.dev_view().get(), x.host_view(), "round trip")


@pytest.mark.parametrize("wire", DEVICE)
def test_address_zero_and_empty_segments(packer, wire):
    """Address 0: zeros on pack, skipped on unpack; empty segments take no
    room."""
    rng = rng_for("holes", wire)
    a = Tensor(9, "float32", rng, shift=1)
    b = Tensor(300, "bfloat16", rng, shift=3)
    specs = [(None, "float16", 0, 7), (a, "float32", 2, 5),
             (a, "float32", 0, 0), (None, "float32", 4, 1),
             (b, "bfloat16", 1, 299), (None, "float16", 0, 0),
             (None, "bfloat16", 0, 1000), (a, "float32", 7, 2),
             (b, "bfloat16", 300, 0)]
    bucket = twin_pack(packer, specs, wire, -1.25)
    assert not bucket.dev_view()[:7].get().view(UINT[2 if wire != "float32"
                                                      else 4]).any()
    back = Bucket(total_of(specs), wire, rng=rng)
    twin_unpack(packer, specs, back, wire, 0.5, 2)
    empty = [(a, "float32", 3, 0), (None, "float16", 0, 0)]
    twin_pack(packer, empty, wire)
    twin_unpack(packer, empty, Bucket(0, wire), wire, 2.0, 2)
    twin_pack(packer, [], wire)


# --- errors ------------------------------------------------------------------

def device_calls(packer, segs, wire="float32", scale=1.0, divisor=1):
    bucket = cupy.zeros(64, np.float64)
    yield lambda: packer.pack(segs, bucket.data.ptr, wire, scale=scale)
    yield lambda: packer.unpack(segs, bucket.data.ptr, wire, scale=scale,
                                divisor=divisor)


@pytest.mark.parametrize("dtype", ["float64", "int32", "int8", "float8"])
def test_device_refuses_other_dtypes(packer, dtype):
    x = cupy.zeros(64, np.float64)
    for call in device_calls(packer, [(x.data.ptr, dtype, 0, 4)]):
        with pytest.raises(ValueError, match="(?i)dtype|float64|int"):
            call()
    y = cupy.zeros(64, np.float32)
    for call in device_calls(packer, [(y.data.ptr, "float32", 0, 4)], dtype):
        with pytest.raises(ValueError, match="(?i)dtype|float64|int"):
            call()


def test_device_errors(packer):
    x = cupy.zeros(64, np.float32)
    h = cupy.zeros(64, np.float16)
    cases = [
        ([(x.data.ptr + 2, "float32", 0, 4)], "align"),
        ([(h.data.ptr + 1, "bfloat16", 0, 4)], "align"),
        ([(x.data.ptr, "float32", -1, 4)], "offset|negative"),
        ([(x.data.ptr, "float32", 0, -4)], "count|negative"),
        ([(x.data.ptr, "float32", 0)], "segment|tuple|length"),
        ([(x.data.ptr, "float32", 0, 4, 0)], "segment|tuple|length"),
        ([(x.data.ptr, "floot32", 0, 4)], "dtype"),
    ]
    for segs, word in cases:
        for call in device_calls(packer, segs):
            with pytest.raises(ValueError, match=f"(?i){word}"):
                call()
    bucket = cupy.zeros(64, np.float32)
    seg = [(x.data.ptr, "float32", 0, 4)]
    for divisor in (0, -3):
        with pytest.raises(ValueError, match="(?i)divisor"):
            packer.unpack(seg, bucket.data.ptr, "float32", divisor=divisor)
    with pytest.raises(ValueError, match="(?i)align"):
        packer.pack(seg, bucket.data.ptr + 2, "float32")
    with pytest.raises(ValueError, match="(?i)align"):
        packer.unpack(seg, bucket.data.ptr + 1, "float16")
    for call in (packer.pack, packer.unpack):
        with pytest.raises(ValueError, match="bucket address is 0"):
            call(seg, 0, "float32")


@pytest.mark.parametrize("wire", DEVICE)
@pytest.mark.parametrize("src", DEVICE)
def test_nan_and_inf_survive(packer, src, wire):
    """NaN stays NaN and inf stays inf through arithmetic (payloads and
    signs of NaN may differ from the host's, so no bitwise check here)."""
    values = np.array([np.nan, -np.nan, np.inf, -np.inf, 1.0], np.float32)
    x = cupy.asarray(from_float(values, src))
    bucket = cupy.zeros(5, STORAGE[wire])
    packer.pack([(x.data.ptr, src, 0, 5)], bucket.data.ptr, wire, scale=-0.5)
    synchronize()
    got = to_float(bucket.get(), wire)
    assert np.isnan(got[:2]).all(), got
    assert got[2:].tolist() == [-np.inf, np.inf, -0.5]
