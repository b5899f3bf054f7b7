"""bench/plot.py: the pictures from the benchmarks' CSV files (made by
running them at 2 ranks with tiny settings) and from a synthetic timeline,
the parsing behind them, and its refusal of bad input."""
import csv
import importlib.util
import json
import os
import subprocess
import sys

import matplotlib.image
import pytest

from launcher import run_program

BENCH = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "bench")
PLOT = os.path.join(BENCH, "plot.py")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

spec = importlib.util.spec_from_file_location("plot", PLOT)
plot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot)


def run_bench(script, args, path):
    """Runs bench/<script> on 2 ranks writing its CSV to `path`; returns
    the CSV's rows."""
    code, out, err, _ = run_program(
        [sys.executable, os.path.join(BENCH, script), *args, "--csv", path],
        2, timeout=300)
    assert code == 0, out + err
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def bandwidth_csvs(tmp_path_factory):
    """The all-reduce benchmark's CSV files, float32 and float16."""
    paths = {}
    for dtype in ("float32", "float16"):
        paths[dtype] = str(tmp_path_factory.mktemp("bench") / f"{dtype}.csv")
        run_bench("allreduce_bench.py",
                  ["--sizes", "4096", "65536", "--rounds", "1", "--budget",
                   "0.01", "--dtype", dtype], paths[dtype])
    return paths


@pytest.fixture(scope="module")
def breakdown_csv(tmp_path_factory):
    """The callback benchmark's CSV file, on a 2-layer MLP of width 64."""
    path = str(tmp_path_factory.mktemp("bench") / "breakdown.csv")
    run_bench("callback_bench.py",
              ["--width", "64", "--layers", "2", "--batch", "4", "--rounds",
               "1", "--iters", "1", "--skip-tiny", "--breakdown-steps", "0",
               "--no-new-cb", "--flight-recorder", "--recorder-pairs", "4"],
              path)
    return path


def synthetic_trace(iterations=3, ranks=2, buckets=2, closed=True,
                    trailing_comma=False):
    """A timeline as nncomm writes it: per rank and iteration a backward
    span, a gradient-ready instant per bucket (no iteration), each bucket's
    pack, reduce and unpack; on rank 0, iteration 1, a barrier span on the
    collectives track (no iteration)."""
    events = [{"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
               "args": {"name": name}}
              for rank in range(ranks)
              for tid, name in enumerate(plot.TRACKS)]
    for k in range(iterations):
        for rank in range(ranks):
            t0 = 10000 * k + 50 * rank
            events.append({"ph": "X", "name": "backward", "pid": rank,
                           "tid": 0, "ts": t0, "dur": 4000,
                           "args": {"iteration": k}})
            for b in range(buckets):
                ready = t0 + 1000 * (b + 1)
                events.append({"ph": "i", "name": f"grad{b}", "pid": rank,
                               "tid": 1, "ts": ready, "s": "t"})
                for step, name in enumerate(("pack", "reduce", "unpack")):
                    events.append({
                        "ph": "X", "name": name, "pid": rank, "tid": 2,
                        "ts": ready + 100 + 1000 * step, "dur": 800,
                        "args": {"bucket": b, "bytes": 4096,
                                 "dtype": "float32", "iteration": k}})
    events.append({"ph": "X", "name": "barrier", "pid": 0, "tid": 3,
                   "ts": 10000 + 4000, "dur": 300})
    text = "[\n" + ",\n".join(json.dumps(e) for e in events)
    return text + (",\n" if trailing_comma else "") + ("\n]" if closed
                                                        else "\n")


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def assert_png(path):
    """The file is a PNG that decodes to a picture of a sensible size."""
    with open(path, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    assert os.path.getsize(path) < 100 * 1024
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] >= 200 \
        and image.shape[1] >= 300, image.shape
    return image


def run_plot(*args):
    """Runs bench/plot.py as a script; returns (exit code, stderr)."""
    proc = subprocess.run([sys.executable, PLOT, *map(str, args)],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stderr


# The benchmarks' CSV files.

def test_allreduce_bench_csv(bandwidth_csvs):
    for dtype, path in bandwidth_csvs.items():
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        assert [(int(r["bytes"]), r["method"]) for r in rows] == [
            (size, method) for size in (4096, 65536)
            for method in ("raw", "raw@nd", "nncomm")]
        for r in rows:
            assert r["dtype"] == dtype and r["ranks"] == "2"
            # 2 ranks: bus bandwidth is bytes / time.
            assert float(r["busbw_gbps"]) == pytest.approx(
                int(r["bytes"]) / float(r["seconds"]) / 1e9)


def test_callback_bench_csv(breakdown_csv):
    with open(breakdown_csv, newline="") as f:
        rows = {r["schedule"]: r for r in csv.DictReader(f)}
    assert list(rows) == ["fb", "comm", "seq", "cb", "cb_cc"]
    step = {name: float(r["step_ms"]) for name, r in rows.items()}
    for name, r in rows.items():
        assert r["ranks"] == "2"
        compute = 0.0 if name == "comm" else step["fb"]
        assert float(r["compute_ms"]) == pytest.approx(compute)
        assert float(r["exposed_comm_ms"]) == pytest.approx(
            step[name] - compute)
    assert step["seq"] > 0 and float(rows["fb"]["exposed_comm_ms"]) == 0


# The pictures, made by the script.

def test_bandwidth_png(bandwidth_csvs, tmp_path):
    one, both = tmp_path / "float32.png", tmp_path / "both.png"
    assert run_plot("bandwidth", bandwidth_csvs["float32"], "-o", one)[0] \
        == 0
    assert run_plot("bandwidth", *bandwidth_csvs.values(), "-o", both)[0] \
        == 0
    # A panel per dtype: float16's makes the picture wider.
    assert assert_png(both).shape[1] > assert_png(one).shape[1]


def test_breakdown_png(breakdown_csv, tmp_path):
    out = tmp_path / "breakdown.png"
    code, err = run_plot("breakdown", breakdown_csv, "-o", out)
    assert code == 0, err
    assert_png(out)


def test_gantt_png(tmp_path):
    trace = write(tmp_path, "trace.json", synthetic_trace(closed=False))
    out = tmp_path / "gantt.png"
    code, err = run_plot("gantt", trace, "-o", out, "--iteration", "1")
    assert code == 0, err
    assert_png(out)


def test_bad_input_from_the_script_exits_2(tmp_path):
    code, err = run_plot("gantt", tmp_path / "missing.json", "-o",
                         tmp_path / "x.png")
    assert code == 2
    assert "missing.json: No such file or directory" in err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("command,text,message", [
    ("bandwidth", None, "No such file or directory"),
    ("bandwidth", "bytes,method,busbw_gbps,dtype\n4096,raw,1.0,float32\n",
     "no column ranks"),
    ("bandwidth", "bytes,method,busbw_gbps,dtype,ranks\n"
     "4096,raw,fast,float32,2\n", "busbw_gbps is 'fast', not a number"),
    ("bandwidth", "bytes,method,busbw_gbps,dtype,ranks\n4096,raw\n",
     ":2: no value for busbw_gbps"),
    ("breakdown", "schedule,step_ms,compute_ms,exposed_comm_ms,ranks\n",
     "no rows under the header"),
    ("breakdown", "", "no column schedule"),
    ("gantt", "not json", "not a Chrome-trace JSON array"),
    ("gantt", '{"traceEvents": []}', "not a JSON array of trace events"),
    ("gantt", "[]", "no complete iteration"),
    ("gantt", '[{"ph": "X", "name": "backward", "pid": 0, "tid": 0, '
              '"ts": 0, "dur": 1, "args": {"iteration": "first"}}]',
     "trace event 'backward' has iteration 'first', not an integer"),
    ("gantt", '[{"ph": "X", "name": "backward", "pid": 0, "tid": 0, '
              '"ts": "soon", "dur": 1, "args": {"iteration": 0}}]',
     "trace event 0 ('backward', ph 'X') has no number for ts or dur"),
])
def test_bad_input_exits_2(command, text, message, tmp_path, capsys):
    path = (tmp_path / "missing" if text is None
            else write(tmp_path, "input", text))
    with pytest.raises(SystemExit) as exit:
        plot.main([command, str(path), "-o", str(tmp_path / "out.png")])
    assert exit.value.code == 2
    assert message in capsys.readouterr().err


def test_iteration_not_in_trace_exits_2(tmp_path, capsys):
    trace = write(tmp_path, "trace.json", synthetic_trace())
    with pytest.raises(SystemExit) as exit:
        plot.main(["gantt", trace, "-o", str(tmp_path / "out.png"),
                   "--iteration", "7"])
    assert exit.value.code == 2
    assert "no event of iteration 7; the trace has iterations 0 to 2" \
        in capsys.readouterr().err


def test_unwritable_output_exits_2(breakdown_csv, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        plot.main(["breakdown", breakdown_csv, "-o",
                   str(tmp_path / "no" / "such" / "dir.png")])
    assert exit.value.code == 2
    assert "cannot write" in capsys.readouterr().err


# The parsing.

def test_bandwidth_lines_keep_the_best_of_each_size():
    rows = [{"bytes": b, "method": m, "busbw_gbps": g, "dtype": d,
             "ranks": 2}
            for b, m, g, d in [(65536, "raw", 1.0, "float32"),
                               (4096, "raw", 0.5, "float32"),
                               (4096, "raw", 0.7, "float32"),
                               (4096, "nncomm", 0.6, "float32"),
                               (4096, "raw", 0.2, "float16")]]
    assert plot.bandwidth_lines(rows) == {
        "float32": {("raw", 2): [(4096, 0.7), (65536, 1.0)],
                    ("nncomm", 2): [(4096, 0.6)]},
        "float16": {("raw", 2): [(4096, 0.2)]}}


def test_size_label():
    assert [plot.size_label(n) for n in (512, 4096, 65536, 1 << 20,
                                         64 << 20, 3 << 30)] == [
        "512 B", "4 KiB", "64 KiB", "1 MiB", "64 MiB", "3 GiB"]


@pytest.mark.parametrize("closed,trailing_comma", [
    (True, False), (False, False), (False, True)])
def test_load_trace_mends_a_missing_bracket(closed, trailing_comma,
                                            tmp_path):
    path = write(tmp_path, "trace.json", synthetic_trace(
        closed=closed, trailing_comma=trailing_comma))
    events, was_closed = plot.load_trace(path)
    assert was_closed == closed
    # 8 thread names, 3 iterations x 2 ranks x (backward, 2 x (ready,
    # pack, reduce, unpack)), the barrier.
    assert len(events) == 8 + 3 * 2 * 9 + 1
    assert events[-1]["name"] == "barrier"


def test_last_complete_iteration():
    events = json.loads(synthetic_trace())
    assert plot.pick_iteration(events, closed=True) == 2
    # Cut short, the last iteration may be unfinished.
    assert plot.pick_iteration(events, closed=False) == 1
    # Rank 1 has not reached iteration 2's backward.
    partial = [e for e in events if not (
        e.get("pid") == 1 and plot.iteration(e) == 2)]
    assert plot.pick_iteration(partial, closed=True) == 1
    assert plot.pick_iteration(events, closed=False, wanted=2) == 2


def test_iteration_events_pick_the_iterations_own():
    events = json.loads(synthetic_trace())
    chosen = plot.iteration_events(events, 1)
    # Per rank: backward, 2 ready instants, 2 x (pack, reduce, unpack);
    # and rank 0's barrier, which starts within its iteration 1.
    assert len(chosen) == 2 * 9 + 1
    for e in chosen:
        if "iteration" in e.get("args", {}):
            assert e["args"]["iteration"] == 1
        else:
            assert 10000 <= e["ts"] <= 20000
    assert sorted(e["name"] for e in chosen if e["ph"] == "i") == [
        "grad0", "grad0", "grad1", "grad1"]
    assert [e["name"] for e in chosen if e["pid"] == 0
            and e["ph"] == "X" and "args" not in e] == ["barrier"]
    assert not [e for e in plot.iteration_events(events, 0)
                if e["name"] == "barrier"]


def test_track_names():
    events = json.loads(synthetic_trace(ranks=1))
    assert plot.track_names(events) == {
        (0, 0): "backward", (0, 1): "gradients", (0, 2): "engine",
        (0, 3): "collectives"}


def test_overlapping_bars_get_lanes():
    assert plot.lanes([(0, 2), (1, 2), (2, 1), (1.5, 3)]) == [0, 1, 0, 2]
    assert plot.lanes([(0, 1), (1, 1), (2, 1)]) == [0, 0, 0]
