"""Pictures of the benchmarks' figures and of a timeline, as PNG files.

    python bench/plot.py bandwidth CSV... -o PNG
    python bench/plot.py breakdown CSV -o PNG
    python bench/plot.py gantt TRACE.json -o PNG [--iteration K]

- ``bandwidth``: bus bandwidth against message size, one line per method
  (``raw``, ``raw@nd``, ``nncomm``), one panel per dtype, from the CSV files
  of ``bench/allreduce_bench.py --csv``. A size measured in several files
  is drawn at its best, as the benchmark keeps the best of its rounds; runs
  at different rank counts get lines of their own.
- ``breakdown``: each schedule's step as a stacked bar, compute below and
  exposed communication above, the step time written on top, from
  ``bench/callback_bench.py --csv``. An exposed time below zero (a step that
  noise made faster than the one without communication) is drawn as none.
- ``gantt``: one iteration of nncomm's timeline (a Chrome-trace JSON array;
  pid is the rank, ``thread_name`` metadata names the tracks) as a Gantt
  chart: a row per rank and track, bars coloured by event name (bars that
  overlap in a row side by side in it), instant events (gradients' ready
  times) as ticks. An event belongs to iteration K
  when its ``args.iteration`` is K, or when it has none and starts, on its
  rank, within the span of that rank's events of iteration K. Without
  ``--iteration``: the last iteration whose ``backward`` span every rank
  has; a trace cut short (no closing ``]``) may have stopped inside its last
  iteration, which is then passed over. Times are drawn from the iteration's
  first event, on the trace's clock (one clock for all ranks, as trace
  viewers assume).

Input that is missing or cannot be read ends the script with a message and
exit status 2. Pictures are drawn with matplotlib's Agg backend (no display
needed) at 100 dpi.
"""
import argparse
import csv
import itertools
import json
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

DPI = 100
METHODS = ("raw", "raw@nd", "nncomm")
DTYPES = ("float32", "float16")
SCHEDULES = {"fb": "no communication", "comm": "all-reduce alone",
             "seq": "no overlap", "cb": "callback",
             "cb_cc": "callback, nnabla's\ncommunicator_callbacks",
             "cb_new": "new callback\neach step",
             "cb_fwd": "callback,\npriority forward",
             "cb_tl": "callback,\ntimeline on"}
TRACKS = ("backward", "gradients", "engine", "collectives")
TIMED = ("X", "i", "I")           # span and instant events
EVENT_COLOURS = {"backward": "tab:blue", "pack": "tab:orange",
                 "reduce": "tab:red", "unpack": "tab:green"}
OTHER_COLOURS = ("tab:purple", "tab:brown", "tab:pink", "tab:olive",
                 "tab:cyan", "tab:gray")
LINE_STYLES = ("-", "--", ":", "-.")


class InputError(Exception):
    """Input no picture can be made from; the message says which and why."""


def read_rows(path, columns):
    """Reads the rows of a CSV file whose header names `columns`.

    Args:
        path (str): the CSV file.
        columns (dict): each column needed, mapped to the type (``int``,
            ``float``, ``str``) its values are converted to.

    Returns:
        list of dict: a dict per row, of the columns needed, converted.

    Raises:
        InputError: the file cannot be read, lacks a column, has no rows or
            a value that is missing or not of its column's type.

    Example:
        >>> read_rows("sizes.csv", {"bytes": int, "method": str})
        [{'bytes': 4096, 'method': 'raw'}, ...]
    """
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in columns if c not in header]
            if missing:
                raise InputError(
                    f"{path}: no column {', '.join(missing)} (the header "
                    f"has: {', '.join(header) or 'nothing'})")
            rows = [convert(row, columns, f"{path}:{reader.line_num}")
                    for row in reader]
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise InputError(f"{path}: not a CSV file ({e})") from None
    if not rows:
        raise InputError(f"{path}: no rows under the header")
    return rows


def convert(row, columns, where):
    """The `columns` of a CSV row, converted; `where` names it in errors."""
    out = {}
    for column, kind in columns.items():
        value = row[column]
        if not value:                     # None: the row is short
            raise InputError(f"{where}: no value for {column}")
        try:
            out[column] = kind(value)
        except ValueError:
            raise InputError(f"{where}: {column} is {value!r}, not "
                             f"{'an integer' if kind is int else 'a number'}"
                             ) from None
    return out


def position(name, known):
    """A sort key: the names of `known` first, in its order, then the rest
    by name."""
    return (known.index(name) if name in known else len(known), str(name))


def order(names, known):
    """`names` with those of `known` first, in its order, then the rest."""
    return sorted(names, key=lambda name: position(name, known))


def bandwidth_lines(rows):
    """Groups the all-reduce benchmark's rows into the lines to draw.

    Args:
        rows (list of dict): rows with bytes, method, busbw_gbps, dtype and
            ranks.

    Returns:
        dict: dtype -> {(method, ranks): [(bytes, best GB/s), ...]}, the
        points in order of size.
    """
    best = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        points = best[r["dtype"]][(r["method"], r["ranks"])]
        points[r["bytes"]] = max(r["busbw_gbps"],
                                 points.get(r["bytes"], float("-inf")))
    return {dtype: {key: sorted(points.items())
                    for key, points in lines.items()}
            for dtype, lines in best.items()}


def size_label(nbytes):
    """4096 -> '4 KiB', 1048576 -> '1 MiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:g} {unit}"
        nbytes /= 1024


def draw_bandwidth(args):
    """The bandwidth picture of the CSV files `args.csv`."""
    rows = [row for path in args.csv for row in read_rows(
        path, {"bytes": int, "method": str, "busbw_gbps": float,
               "dtype": str, "ranks": int})]
    lines = bandwidth_lines(rows)
    dtypes = order(lines, DTYPES)
    rank_counts = sorted({r["ranks"] for r in rows})
    sizes = sorted({r["bytes"] for r in rows})
    fig, axes = plt.subplots(1, len(dtypes), sharey=True, squeeze=False,
                             figsize=(5 * len(dtypes) + 1, 4))
    for ax, dtype in zip(axes[0], dtypes):
        for method, ranks in order(lines[dtype], [
                (m, n) for m in METHODS for n in rank_counts]):
            points = lines[dtype][(method, ranks)]
            label = method if len(rank_counts) == 1 \
                else f"{method}, {ranks} ranks"
            colour = (f"C{METHODS.index(method)}" if method in METHODS
                      else None)
            ax.plot(*zip(*points), marker="o", label=label, color=colour,
                    linestyle=LINE_STYLES[rank_counts.index(ranks)
                                          % len(LINE_STYLES)])
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [size_label(s) for s in sizes], rotation=45)
        ax.minorticks_off()
        ax.set_title(dtype)
        ax.set_xlabel("message size")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0][0].set_ylabel("bus bandwidth (GB/s)")
    ranks = (f"{rank_counts[0]} ranks" if len(rank_counts) == 1
             else "ranks as labelled")
    fig.suptitle(f"All-reduce bus bandwidth, {ranks}")
    return fig


def milliseconds(ms):
    """4458.81 -> '4458.8', 0.29883 -> '0.299': no powers of ten."""
    return f"{ms:.1f}" if abs(ms) >= 10 else f"{ms:.3g}"


def draw_breakdown(args):
    """The breakdown picture of the CSV file `args.csv`."""
    rows = read_rows(args.csv, {"schedule": str, "step_ms": float,
                                "compute_ms": float,
                                "exposed_comm_ms": float, "ranks": int})
    at = range(len(rows))
    compute = [r["compute_ms"] for r in rows]
    fig, ax = plt.subplots(figsize=(1.3 * len(rows) + 2, 4))
    ax.bar(at, compute, label="compute", color="tab:blue")
    ax.bar(at, [max(0.0, r["exposed_comm_ms"]) for r in rows],
           bottom=compute, label="exposed communication", color="tab:red")
    for x, r in zip(at, rows):
        top = r["compute_ms"] + max(0.0, r["exposed_comm_ms"])
        ax.annotate(milliseconds(r["step_ms"]), (x, top), ha="center",
                    va="bottom", textcoords="offset points", xytext=(0, 2))
    ax.set_xticks(at, [f"{r['schedule']}\n"
                       f"{SCHEDULES.get(r['schedule'], '')}" for r in rows],
                  fontsize=8)
    ax.set_ylabel("ms per step")
    ax.margins(y=0.12)
    # Outside the axes: inside, it covered the tallest bars' labels.
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    ranks = sorted({r["ranks"] for r in rows})
    fig.suptitle(f"A step's breakdown, "
                 f"{'/'.join(map(str, ranks))} ranks")
    return fig


def load_trace(path):
    """Reads a Chrome-trace JSON array, also one cut short.

    A writer that stopped (or is still writing) leaves no closing bracket,
    and maybe a comma after the last event; both are mended.

    Args:
        path (str): the trace file.

    Returns:
        tuple: (list of dict, the events; bool, whether the array was
        closed).

    Raises:
        InputError: the file cannot be read or is not such an array.
    """
    try:
        with open(path) as f:
            text = f.read().rstrip()
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a JSON text file") from None
    closed = text.endswith("]")
    if text.startswith("[") and not closed:
        text = text.rstrip(",") + "]"
    try:
        events = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not a Chrome-trace JSON array "
                         f"({e})") from None
    if not isinstance(events, list) or \
            not all(isinstance(e, dict) for e in events):
        raise InputError(f"{path}: not a JSON array of trace events")
    return events, closed


def iteration(event):
    """The event's args.iteration, or None; InputError if not an int."""
    args = event.get("args")
    k = args.get("iteration") if isinstance(args, dict) else None
    if k is not None and (not isinstance(k, int) or isinstance(k, bool)):
        raise InputError(f"trace event {event.get('name')!r} has iteration "
                         f"{k!r}, not an integer")
    return k


def pick_iteration(events, closed, wanted=None):
    """The iteration to draw.

    Args:
        events (list of dict): the trace's events.
        closed (bool): whether the trace's array was closed.
        wanted (int): the iteration asked for, or None for the last
            complete one: the last whose ``backward`` span every rank has,
            less the last iteration of a trace that was not closed.

    Returns:
        int: the iteration.

    Raises:
        InputError: no event has the iteration asked for, or (None asked
            for) no iteration is complete.
    """
    seen = {iteration(e) for e in events if e.get("ph") in TIMED} - {None}
    if wanted is not None:
        if wanted not in seen:
            raise InputError(f"no event of iteration {wanted}; the trace "
                             f"has {describe(seen)}")
        return wanted
    backward = defaultdict(set)
    for e in events:
        if e.get("ph") == "X" and e.get("name") == "backward":
            backward[e.get("pid")].add(iteration(e))
    complete = set.intersection(*backward.values()) - {None} \
        if backward else set()
    if not closed and seen:
        complete.discard(max(seen))
    if not complete:
        raise InputError(f"no complete iteration (a backward span on every "
                         f"rank) in a trace with {describe(seen)}; choose "
                         f"one with --iteration")
    return max(complete)


def describe(iterations):
    """'iterations 0 to 4', 'iteration 3' or 'no iteration'."""
    if not iterations:
        return "no iteration"
    low, high = min(iterations), max(iterations)
    return (f"iteration {low}" if low == high
            else f"iterations {low} to {high}")


def iteration_events(events, k):
    """The span ("X") and instant ("i", "I") events of iteration `k`.

    Args:
        events (list of dict): the trace's events.
        k (int): the iteration.

    Returns:
        list of dict: those with args.iteration `k`, and those with none
        that start within their rank's span of them, each with float ts
        and (spans) dur.

    Raises:
        InputError: an event lacks a number for ts or dur.
    """
    timed = [timed_event(i, e) for i, e in enumerate(events)
             if e.get("ph") in TIMED]
    windows = {}
    for e in timed:
        if iteration(e) == k:
            low, high = windows.get(e.get("pid"), (e["ts"], e["ts"]))
            windows[e.get("pid")] = (min(low, e["ts"]),
                                     max(high, e["ts"] + e["dur"]))
    return [e for e in timed if iteration(e) == k or (
        iteration(e) is None and e.get("pid") in windows
        and windows[e["pid"]][0] <= e["ts"] <= windows[e["pid"]][1])]


def timed_event(index, event):
    """The event with its ts and dur (0 for instants) as floats."""
    try:
        return dict(event, ts=float(event["ts"]), dur=float(
            event["dur"] if event["ph"] == "X" else 0.0))
    except (KeyError, TypeError, ValueError):
        raise InputError(f"trace event {index} ({event.get('name')!r}, "
                         f"ph {event['ph']!r}) has no number for "
                         f"{'ts or dur' if event['ph'] == 'X' else 'ts'}") \
            from None


def track_names(events):
    """(pid, tid) -> the track's name from the thread_name metadata."""
    return {(e.get("pid"), e.get("tid")): str(e["args"]["name"])
            for e in events if e.get("ph") == "M"
            and e.get("name") == "thread_name"
            and isinstance(e.get("args"), dict) and "name" in e["args"]}


def rank_key(pid):
    """A sort key for pids: ranks (ints) in order, then anything else."""
    return (0, pid, "") if isinstance(pid, int) else (1, 0, str(pid))


def lanes(bars):
    """Lays a row's overlapping bars side by side.

    Args:
        bars (list of tuple): each bar's (start, length).

    Returns:
        list of int: each bar's lane, 0 first: the first lane whose bars
        all end by the bar's start, bars taken in order of start.

    Example:
        >>> lanes([(0, 2), (1, 2), (2, 1)])
        [0, 1, 0]
    """
    ends, lane = [], [0] * len(bars)
    for i in sorted(range(len(bars)), key=lambda i: bars[i][0]):
        start, length = bars[i]
        free = [j for j, end in enumerate(ends) if end <= start]
        lane[i] = free[0] if free else len(ends)
        if not free:
            ends.append(0.0)
        ends[lane[i]] = start + length
    return lane


def draw_gantt(args):
    """The Gantt chart of `args.iteration` (None: the last complete one) in
    the trace `args.trace`."""
    events, closed = load_trace(args.trace)
    k = pick_iteration(events, closed, args.iteration)
    chosen = iteration_events(events, k)
    names = track_names(events)

    def row_of(e):
        pid = e.get("pid")
        return pid, names.get((pid, e.get("tid")), f"tid {e.get('tid')}")

    rows = sorted({row_of(e) for e in chosen},
                  key=lambda row: (rank_key(row[0]),
                                   position(row[1], TRACKS)))
    y = {row: i for i, row in enumerate(rows)}
    start = min(e["ts"] for e in chosen)
    spans, ticks = defaultdict(list), []
    for e in chosen:
        at, begin = y[row_of(e)], (e["ts"] - start) / 1e3
        if e["ph"] == "X":
            spans[at].append((begin, e["dur"] / 1e3, str(e.get("name"))))
        else:
            ticks.append((begin, at))
    boxes = defaultdict(lambda: ([], [], [], []))  # bottoms, lefts, ...
    for at, bars in spans.items():
        lane = lanes([bar[:2] for bar in bars])
        height = 0.7 / (max(lane) + 1)
        for (begin, length, name), i in zip(bars, lane):
            for column, value in zip(boxes[name], (
                    at - 0.35 + i * height, begin, length, height)):
                column.append(value)
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.4 * len(rows)))
    others = itertools.cycle(OTHER_COLOURS)
    legend = []
    for name in order(boxes, list(EVENT_COLOURS)):
        bottoms, lefts, widths, heights = boxes[name]
        colour = EVENT_COLOURS.get(name) or next(others)
        ax.barh(bottoms, widths, heights, lefts, align="edge", color=colour)
        legend.append(Patch(color=colour, label=name))
    if ticks:
        xs, ats = zip(*ticks)
        ax.vlines(xs, [a - 0.4 for a in ats], [a + 0.4 for a in ats],
                  color="black", linewidth=0.8)
        legend.append(Line2D([], [], color="black", marker="|",
                             linestyle="none", markersize=10,
                             label="instant (gradient ready)"))
    ax.set_yticks(range(len(rows)),
                  [f"rank {pid} {name}" for pid, name in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("ms from the iteration's first event")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1),
              fontsize=8)
    fig.suptitle(f"Timeline of iteration {k}")
    return fig


def parser():
    """The command line: a subcommand per picture."""
    top = argparse.ArgumentParser(prog="plot.py",
                                  description=__doc__.split("\n")[0])
    commands = top.add_subparsers(dest="command", required=True)
    bandwidth = commands.add_parser(
        "bandwidth", help="bus bandwidth against message size")
    bandwidth.add_argument("csv", nargs="+",
                           help="CSV of bench/allreduce_bench.py --csv")
    bandwidth.set_defaults(draw=draw_bandwidth)
    breakdown = commands.add_parser(
        "breakdown", help="a step's compute and exposed communication")
    breakdown.add_argument("csv", help="CSV of bench/callback_bench.py --csv")
    breakdown.set_defaults(draw=draw_breakdown)
    gantt = commands.add_parser("gantt", help="one iteration of a timeline")
    gantt.add_argument("trace", help="Chrome-trace JSON of nncomm's timeline")
    gantt.add_argument("--iteration", type=int, metavar="K",
                       help="the iteration (default: the last complete one)")
    gantt.set_defaults(draw=draw_gantt)
    for command in (bandwidth, breakdown, gantt):
        command.add_argument("-o", "--output", required=True, metavar="PNG",
                             help="the PNG file to write")
        command.set_defaults(parser=command)
    return top


def main(argv=None):
    """Draws the picture the command line `argv` asks for (None: the
    script's); bad input exits with status 2 and a message."""
    args = parser().parse_args(argv)
    try:
        fig = args.draw(args)
        fig.tight_layout()
        try:
            fig.savefig(args.output, dpi=DPI, format="png")
        except OSError as e:
            raise InputError(f"cannot write {args.output}: "
                             f"{e.strerror}") from None
    except InputError as e:
        args.parser.error(str(e))


if __name__ == "__main__":
    main()
