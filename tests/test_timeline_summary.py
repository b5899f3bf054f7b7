"""nncomm.timeline_summary without MPI, on timelines made up here whose
answers are worked out by hand: iterations found in the device track as a
rank writes it, the tail after the last gradients, the reduce time inside
it, per-bucket medians, the host's wait for the engine, the collectives'
calls and time, and the command line. That the ranks' real device tracks
summarize (buckets and bytes) is checked by tests/mpi/gpu_arrays.py on
emulated devices."""
import json

import pytest

from nncomm import timeline, timeline_summary


def span(rank, cat, name, ts, dur, **args):
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur,
            "pid": rank, "tid": 6 if cat == "device" else 1, "args": args}


def device_iteration(rank, start, shift=0.0):
    """Two buckets as a rank writes them: bucket 1 (staged, 400 bytes)
    then bucket 0 (reduced in place, 800 bytes). Bucket 1's gradients are
    done at +10, bucket 0's at +30 (the last); bucket 0's reduce runs from
    +30 to +45 + shift, so the tail after the gradients is 15 + shift."""
    s = start
    return [
        span(rank, "device", "wait_gradients", s, 10, bucket=1, bytes=400),
        span(rank, "device", "pack", s + 10, 1, bucket=1, bytes=400),
        span(rank, "device", "reduce", s + 11, 18, bucket=1, bytes=400),
        span(rank, "device", "unpack", s + 29, 2, bucket=1, bytes=400),
        span(rank, "device", "wait_gradients", s + 5, 25, bucket=0,
             bytes=800),
        span(rank, "device", "reduce", s + 30, 15 + shift, bucket=0,
             bytes=800),
    ]


def test_device_iterations_split_where_a_bucket_comes_again():
    events = device_iteration(0, 0) + device_iteration(0, 100)
    iterations = timeline_summary.device_iterations(events)
    assert len(iterations) == 2
    assert [sorted(it) for it in iterations] == [[0, 1], [0, 1]]
    assert sorted(iterations[1][1]) == ["pack", "reduce", "unpack",
                                        "wait_gradients"]
    assert iterations[1][0]["reduce"]["ts"] == 130


def test_iterations_of_one_bucket_each_are_told_apart():
    events = []
    for it, reduce in enumerate((20, 22, 18, 20, 21)):
        events += [
            span(0, "device", "wait_gradients", it * 100, 5, bucket=0,
                 bytes=4),
            span(0, "device", "reduce", it * 100 + 5, reduce, bucket=0,
                 bytes=4)]
    device = timeline_summary.summarize(events)[0].device
    assert device.iterations == 5
    assert device.reduce == 20 and device.tail == 20


def test_device_summary_medians_over_iterations():
    events = (device_iteration(0, 0, shift=0) + device_iteration(0, 100,
              shift=4) + device_iteration(0, 200, shift=8))
    host, device, collectives = timeline_summary.summarize(events)[0]
    assert host is None and collectives == {}
    assert device.iterations == 3
    assert device.gradients == 30
    assert device.tail == pytest.approx(19)        # 15 + the median shift
    assert device.span == pytest.approx(49)
    # Bucket 1's reduce (+11 to +29) ends before the last gradients; only
    # bucket 0's counts after them.
    assert device.reduce_after == pytest.approx(19)
    assert device.wait_gradients == 35
    assert (device.pack, device.unpack) == (1, 2)
    assert device.reduce == pytest.approx(18 + 19)
    assert device.buckets == {
        0: timeline_summary.Bucket(800, 30, 0, 19, 0),
        1: timeline_summary.Bucket(400, 10, 1, 18, 2)}


def test_a_reduce_that_straddles_the_last_gradients_counts_its_part_after():
    events = [
        span(0, "device", "wait_gradients", 0, 10, bucket=0, bytes=4),
        span(0, "device", "reduce", 10, 30, bucket=0, bytes=4),
        span(0, "device", "wait_gradients", 0, 25, bucket=1, bytes=4),
        span(0, "device", "reduce", 40, 5, bucket=1, bytes=4),
    ]
    device = timeline_summary.summarize(events)[0].device
    assert (device.gradients, device.tail) == (25, 20)
    assert device.reduce_after == 15 + 5


def test_host_iterations_and_ranks_apart():
    events = []
    for it, (backward, wait) in enumerate([(50, 5), (70, 9), (60, 7)]):
        events.append(span(1, "backward", "backward", it * 100, backward,
                           iteration=it))
        events.append(span(1, "backward", "wait_engine", it * 100 + 40,
                           wait, iteration=it))
    events += device_iteration(0, 0)
    events.append(span(1, "engine", "reduce", 0, 99, bucket=0))  # not used
    events += [span(1, "collectives", "all_reduce", 0, d) for d in (3, 4)]
    events.append(span(2, "collectives", "bcast", 0, 5))
    ranks = timeline_summary.summarize(events)
    assert sorted(ranks) == [0, 1, 2]
    assert ranks[1] == (timeline_summary.Host(3, 60, 7), None,
                        {"all_reduce": (2, 7)})
    assert ranks[0].host is None and ranks[0].device.iterations == 1
    assert ranks[2] == (None, None, {"bcast": (1, 5)})


def test_command_line_reports_in_milliseconds(tmp_path, capsys):
    path = tmp_path / "t.json"
    events = device_iteration(2, 0) + [
        span(2, "backward", "backward", 0, 2000, iteration=0),
        span(2, "backward", "wait_engine", 1500, 500, iteration=0),
        span(2, "collectives", "all_gather", 2000, 7)]
    # As the ranks write them: one event a line.
    path.write_text("[\n" + ",\n".join(map(json.dumps, events)) + "\n]\n")
    assert timeline.main(["summary", str(path), "--buckets"]) == 0
    out = capsys.readouterr().out
    assert "rank 2:" in out
    assert "collectives: all_gather 1 calls in 0.007" in out
    assert "backward 2.000, the framework waiting for the engine after " \
           "it 0.500" in out
    assert "last gradients at 0.030, then 0.015 (reduce 0.015 of it)" in out
    assert "    1        400   0.010   0.001   0.018   0.002" in out
    empty = tmp_path / "empty.json"
    empty.write_text("[\n]\n")
    timeline.main(["summary", str(empty)])
    assert "no iterations or collectives recorded" in \
        capsys.readouterr().out
    with pytest.raises(SystemExit):
        timeline.main(["summary", str(tmp_path / "missing.json")])
