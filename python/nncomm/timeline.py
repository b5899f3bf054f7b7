"""Timeline files: the part each rank records nncomm's timeline into, and
the one file the parts are merged into.

While a timeline is recorded (``NNCOMM_TIMELINE=path`` at ``init()``, or
``comm.start_timeline(path)``), rank r writes its events into a part of
its own, ``path.rank<r>`` (:func:`part_path`): no rank waits for another
to record. ``comm.stop_timeline()``, once every rank has closed its part,
has rank 0 merge the parts into ``path``, the one file to open in Perfetto
or chrome://tracing, and remove them; so does the interpreter's exit, where
rank 0 waits a bounded time for the other ranks' parts instead of meeting
them. Where a part was missing or cut short (ranks on hosts that share no
file system with rank 0, a job that died), every part is kept, to merge by
hand once all are there::

    python -m nncomm.timeline merge timeline.json timeline.json.rank*

Every file is a JSON array of Trace Event Format events, one a line. A part
whose rank died lacks the closing ``]`` (which the format makes optional)
and may end in a half-written line, which is left out.
"""
import argparse
import collections
import json
import os
import sys
import time
import warnings

# How often a wait for parts looks at them again, in seconds.
_POLL_SECONDS = 0.05

Merged = collections.namedtuple("Merged", ["events", "incomplete"])
Merged.__doc__ = """What :func:`merge` wrote: ``events``, how many, and
``incomplete``, the parts that lacked their closing ``]`` (their rank did
not stop its timeline)."""


def part_path(path, rank):
    """
    Args:
        path (str): The timeline file.
        rank (int): A world rank.

    Returns:
        str: The part rank `rank` records into.
    """
    return f"{path}.rank{rank}"


def is_complete(path):
    """
    Args:
        path (str): A timeline file or part.

    Returns:
        bool: Whether it ends with the closing ``]``: its rank stopped
        recording and wrote every event.
    """
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - 2, 0))
            return f.read() == b"]\n"
    except OSError:
        return False


def _event_lines(path):
    """The lines of a timeline file that hold whole events."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            text = line.strip().rstrip(",")
            if text in ("", "[", "]"):
                continue
            try:
                json.loads(text)
            except ValueError:
                continue  # the last line of a rank that died
            yield text


def load(path):
    """Reads a timeline file, merged or a part, complete or not.

    Args:
        path (str): The file.

    Returns:
        list of dict: Its events, in the file's order.

    Example:

    .. code-block:: python

        events = nncomm.timeline.load("timeline.json")
        packs = [e for e in events if e["name"] == "pack"]
    """
    return [json.loads(text) for text in _event_lines(path)]


def merge(out, parts):
    """Writes the events of `parts` into one timeline file `out`, replacing
    it at once (a viewer never sees half of it).

    Args:
        out (str): The file to write.
        parts (list of str): Timeline files: the ranks' parts, whole or
            not, or other timelines.

    Returns:
        :obj:`Merged`: How many events were written, and which parts were
        incomplete.

    Example:

    .. code-block:: python

        nncomm.timeline.merge("timeline.json",
                              glob.glob("timeline.json.rank*"))
    """
    events = 0
    temporary = f"{out}.merging"
    with open(temporary, "w", encoding="utf-8") as f:
        f.write("[")
        for part in parts:
            for text in _event_lines(part):
                f.write(",\n" if events else "\n")
                f.write(text)
                events += 1
        f.write("\n]\n")
    os.replace(temporary, out)
    return Merged(events, [p for p in parts if not is_complete(p)])


def merge_parts(path, size, wait_seconds=0.0):
    """Rank 0's merge of the parts of `size` ranks into the timeline at
    `path`. The parts are removed when every one was there and complete;
    otherwise they are all kept, for a merge by hand once the others are
    in, and a warning names those missing or incomplete.

    Args:
        path (str): The timeline file.
        size (int): The number of ranks.
        wait_seconds (float): How long to wait for parts still being
            written (at exit, where the ranks no longer meet first).

    Returns:
        :obj:`Merged`: What was merged.
    """
    parts = [part_path(path, r) for r in range(size)]
    deadline = time.monotonic() + wait_seconds
    while not all(map(is_complete, parts)) and time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS)
    present = [p for p in parts if os.path.exists(p)]
    merged = merge(path, present)
    missing = [p for p in parts if p not in present]
    if not missing and not merged.incomplete:
        for p in parts:
            os.remove(p)
        return merged
    warnings.warn(
        f"nncomm's timeline {path} lacks ranks' events: parts missing "
        f"{missing} (ranks on hosts that do not share this file system), "
        f"incomplete {merged.incomplete} (ranks that did not stop their "
        f"timeline); the parts are kept: once all are complete, merge "
        f"them with python -m nncomm.timeline merge {path} {path}.rank*",
        RuntimeWarning)
    return merged


def main(argv=None):
    """``python -m nncomm.timeline merge OUT PARTS...`` and
    ``python -m nncomm.timeline summary FILE [--buckets]``."""
    parser = argparse.ArgumentParser(
        prog="python -m nncomm.timeline",
        description="Merges the parts of an nncomm timeline (one per rank, "
        "complete or not) into one file for Perfetto or chrome://tracing, "
        "or summarizes one.")
    commands = parser.add_subparsers(dest="command", required=True)
    merging = commands.add_parser("merge", help="merge parts into one file")
    merging.add_argument("out", help="the timeline file to write")
    merging.add_argument("parts", nargs="+", help="the parts to merge")
    summary = commands.add_parser(
        "summary", help="each rank's iterations in numbers: the wait for "
        "communication after backward, the device's time per step")
    summary.add_argument("path", help="a timeline file or part")
    summary.add_argument("--buckets", action="store_true",
                         help="also a line per bucket of the device track")
    args = parser.parse_args(argv)
    paths = args.parts if args.command == "merge" else [args.path]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    if args.command == "summary":
        from nncomm.timeline_summary import report
        print(report(load(args.path), buckets=args.buckets))
        return 0
    merged = merge(args.out, args.parts)
    print(f"{args.out}: {merged.events} events from {len(args.parts)} "
          f"parts")
    for part in merged.incomplete:
        print(f"  {part} was incomplete (its rank did not stop the "
              f"timeline): its whole lines were merged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
