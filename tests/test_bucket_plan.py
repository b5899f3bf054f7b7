"""The callback's bucket plan, in one process: every element of every
reached tensor travels exactly once, in launch order, in buckets of at most
pack_size elements of one wire dtype."""
import numpy as np
import pytest

from nncomm._nncomm import plan_gradient_buckets

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)


NEVER = 2**62  # direct_bytes that makes no tensor direct


def check_plan(counts, dtypes, order, pack_size, keep_dtype, wire=F32,
               direct_bytes=NEVER):
    plan = plan_gradient_buckets(counts, dtypes, order, pack_size, keep_dtype,
                                 wire, direct_bytes)
    covered = {t: [] for t in order}
    for dt, direct, segments in plan:
        assert segments, "no empty bucket"
        if direct:
            assert len(segments) == 1, "a direct bucket is one piece"
            t = segments[0][0]
            assert counts[t] * dt.itemsize >= direct_bytes and \
                np.dtype(dtypes[t]) == dt
        if keep_dtype:
            assert all(np.dtype(dtypes[t]) == dt for t, *_ in segments)
        else:
            assert dt == wire
        filled = 0
        for t, offset, count in segments:
            assert count > 0
            filled += count
            covered[t].append((offset, count))
        assert filled <= pack_size
    for t in order:
        pieces = covered[t]
        assert [o for o, _ in pieces] == list(
            np.cumsum([0] + [c for _, c in pieces])[:-1]), \
            f"tensor {t} split in order, without gaps or overlaps"
        assert sum(c for _, c in pieces) == counts[t]
    # Launch order: among packed buckets of one dtype, a tensor's first
    # piece never comes before an earlier tensor's (direct buckets go out
    # when their tensor's turn comes, while the open bucket keeps filling).
    first = {}
    for k, (dt, direct, segments) in enumerate(plan):
        for t, *_ in segments:
            first.setdefault(t, (k, dt, direct))
    for a, b in zip(order, order[1:]):
        if counts[a] and counts[b] and first[a][1:] == first[b][1:] \
                and not first[a][2]:
            assert first[a][0] <= first[b][0]
    return plan


@pytest.mark.parametrize("pack_size", [1, 2, 3, 8, 1000, 10**6])
def test_plan_covers_every_element(pack_size):
    counts = [5, 0, 17, 1, 64, 3]
    order = [5, 4, 3, 2, 1, 0]
    plan = check_plan(counts, [F32] * 6, order, pack_size, False)
    total = sum(counts)
    assert len(plan) == -(-total // pack_size), "buckets are filled"


def test_plan_splits_a_tensor_across_buckets():
    plan = check_plan([10], [F32], [0], 4, False)
    assert [segs for _, _, segs in plan] == [
        [(0, 0, 4)], [(0, 4, 4)], [(0, 8, 2)]]


def test_plan_only_the_given_tensors():
    plan = check_plan([3, 4, 5], [F32] * 3, [2, 0], 100, False)
    assert {t for _, _, segs in plan for t, *_ in segs} == {0, 2}


@pytest.mark.parametrize("pack_size", [1, 4, 7, 1000])
def test_plan_keep_dtype_separates_dtypes(pack_size):
    counts = [6, 5, 4, 3, 9]
    dtypes = [F16, F32, F16, F64, F32]
    check_plan(counts, dtypes, [4, 3, 2, 1, 0], pack_size, True)


def test_plan_converts_without_keep_dtype():
    plan = check_plan([3, 3], [F16, F64], [1, 0], 100, False, wire=F32)
    assert len(plan) == 1 and plan[0][0] == F32


@pytest.mark.parametrize("pack_size", [3, 8, 1000])
def test_plan_large_tensors_go_direct(pack_size):
    counts = [5, 40, 2, 64, 7]
    dtypes = [F32, F32, F32, F16, F32]
    plan = check_plan(counts, dtypes, [4, 3, 2, 1, 0], pack_size, False,
                      direct_bytes=120)
    direct = {segs[0][0] for _, d, segs in plan if d}
    # 40 float32 elements go direct; 64 float16 ones need conversion.
    assert direct == {1}
    packed = {t for _, d, segs in plan if not d for t, *_ in segs}
    assert packed == {0, 2, 3, 4}


def _pieces(plan):
    """The element ranges a plan moves, in launch order, adjacent pieces of
    one tensor joined."""
    out = []
    for _, _, segments in plan:
        for t, offset, count in segments:
            if out and out[-1][0] == t and sum(out[-1][1:]) == offset:
                out[-1] = (t, out[-1][1], out[-1][2] + count)
            else:
                out.append((t, offset, count))
    return out


@pytest.mark.parametrize("floor", [1, 40, 100, 10**9])
@pytest.mark.parametrize("keep_dtype", [False, True])
def test_merged_plan_moves_the_same_pieces_in_fewer_buckets(floor,
                                                            keep_dtype):
    counts = [5, 40, 2, 64, 7, 30, 0, 11]
    dtypes = [F32, F32, F16, F16, F32, F64, F32, F16]
    args = (counts, dtypes, list(reversed(range(8))), 8, keep_dtype, F32,
            120)
    drafted = plan_gradient_buckets(*args)
    merged = plan_gradient_buckets(*args, floor_bytes=floor)
    assert _pieces(merged) == _pieces(drafted)
    def size(bucket):
        return sum(count for *_, count in bucket[2]) * bucket[0].itemsize

    for k, (dt, direct, segments) in enumerate(merged):
        # Under the floor only before another dtype, a bucket that reaches
        # the floor itself, or the end.
        after = merged[k + 1] if k + 1 < len(merged) else None
        assert size(merged[k]) >= floor or after is None or \
            after[0] != dt or size(after) >= floor
        assert not direct or len(segments) == 1
        for a, b in zip(segments, segments[1:]):
            assert not (a[0] == b[0] and a[1] + a[2] == b[1]), \
                "adjacent pieces of one tensor are one segment"
    runs = 1 + sum(a[0] != b[0] for a, b in zip(drafted, drafted[1:]))
    if floor == 1:
        assert merged == drafted
    elif floor == 10**9:
        assert len(merged) == runs
    else:
        assert runs <= len(merged) < len(drafted)


def test_merged_pieces_of_one_tensor_stay_direct():
    # 40 float32 in direct pieces of 10 (40 bytes): three join into one
    # piece of 120 bytes, still reduced where it lies; the last stays.
    merged = plan_gradient_buckets([40], [F32], [0], 10, False, F32, 40,
                                   floor_bytes=100)
    assert merged == [(F32, True, [(0, 0, 30)]), (F32, True, [(0, 30, 10)])]


def test_a_bucket_at_the_floor_is_not_merged_into_a_smaller_one():
    # Tensor 0's direct pieces of 400 and 20 bytes, then tensor 1's of 400:
    # the 20-byte one stays alone rather than take a bucket that reaches the
    # floor itself out of its place.
    args = ([105, 100], [F32, F32], [0, 1], 100, False, F32, 400)
    drafted = plan_gradient_buckets(*args)
    assert [d for _, d, _ in drafted] == [True, True, True]
    assert plan_gradient_buckets(*args, floor_bytes=400) == drafted
