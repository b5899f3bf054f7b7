"""Flight records: which rank of a hung or failed job diverged first, and
where, from the records its ranks wrote.

Every rank keeps the last ``NNCOMM_FLIGHT_RECORDER`` operations (default
2000) of each of its communicators and writes them, as
``nncomm-flight-<world rank>.json``, into ``NNCOMM_FLIGHT_RECORDER_DIR``
(see :meth:`nncomm.Communicator.dump_flight_record` for when). Operations
are numbered per communicator, the same on every rank making the same
calls, so the ranks' records line up by number::

    python -m nncomm.flight DIR

prints, for the group where it happened first, the first operation that
not every rank of the group completed: the ranks that never reached it,
that made another call in its place, or that left no record at all (killed
before they could write one), each with its last operation, and the ranks
that were waiting in it. :func:`analyze` is the analysis, a pure function
of the records (:func:`load`).
"""
import argparse
import collections
import glob
import json
import os
import sys

# One record's identity: what the ranks must agree on at a position.
_CALL_FIELDS = ("op", "fingerprint", "phase")

Divergence = collections.namedtuple(
    "Divergence", ["group", "channel", "seq", "expected", "waiting",
                   "completed", "not_reached", "different", "no_record",
                   "last"])
Divergence.__doc__ = """The first operation of one group that not every
rank of it completed.

``group``: its world ranks; ``channel``: which of the group's
communicators (0: its collectives, then its callback engines, in the order
they were made); ``seq``: the operation's number. ``expected``: the
record most ranks that reached it have (None where no rank has). The rest
are world ranks: ``waiting`` reached it with that call and did not
complete it, ``completed`` did; ``not_reached`` never came to it;
``different`` made another call in its place, as a dict rank -> record;
``no_record``: ranks that wrote no file. ``last``: rank -> its last
operation in any group, as ``(group, channel, record)``, for the ranks
that did not reach it or made another call."""

Analysis = collections.namedtuple(
    "Analysis", ["world_size", "ranks", "missing", "divergences",
                 "other_job"])
Analysis.__doc__ = """What :func:`analyze` found: ``world_size``;
``ranks``, the world ranks that wrote a record; ``missing``, those that did
not; ``divergences``, one :class:`Divergence` per group that has one, the
one that began first first (an empty list: every rank completed every
operation it recorded); ``other_job``, the world ranks whose file another
job wrote (not the job of the newest record, in the same directory): left
out, and so among ``missing``."""


def load(directory):
    """Reads the flight records of `directory`.

    Args:
        directory (str): Where the ranks wrote their
            ``nncomm-flight-<rank>.json``.

    Returns:
        dict: World rank -> its record (the file's JSON).

    Raises:
        FileNotFoundError: `directory` is no directory.
        ValueError: It holds no flight record, or a file that is not one.
    """
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{directory}: no such directory")
    dumps = {}
    for path in sorted(glob.glob(os.path.join(directory,
                                              "nncomm-flight-*.json"))):
        try:
            with open(path, encoding="utf-8") as f:
                dump = json.load(f)
        except ValueError as e:
            raise ValueError(f"{path} is not a flight record: {e}") from None
        if not isinstance(dump, dict) or "nncomm_flight_record" not in dump:
            raise ValueError(f"{path} is not a flight record")
        if dump["rank"] >= 0:
            dumps[dump["rank"]] = dump
    if not dumps:
        raise ValueError(f"{directory} holds no nncomm-flight-<rank>.json "
                         f"(NNCOMM_FLIGHT_RECORDER_DIR, or the ranks wrote "
                         f"none)")
    return dumps


def _call(record):
    return tuple(record[k] for k in _CALL_FIELDS)


def _groups(dumps):
    """(world ranks, channel) -> {rank: (last seq, {seq: record})}."""
    groups = collections.defaultdict(dict)
    for rank, dump in dumps.items():
        for g in dump["groups"]:
            if not g["world_ranks"]:
                continue  # still being created: no ranks to compare
            key = (tuple(g["world_ranks"]), g["channel"])
            groups[key][rank] = (g["last_seq"],
                                 {r["seq"]: r for r in g["records"]})
    return groups


def _last_operation(dump):
    """The rank's most recent operation in any group, or None."""
    best = None
    for g in dump["groups"]:
        for r in g["records"]:
            if best is None or r["enqueued"] > best[2]["enqueued"]:
                best = (tuple(g["world_ranks"]), g["channel"], r)
    return best


def _first_divergence(key, members, dumps):
    """The group's first operation not every member completed, or None."""
    group, channel = key
    # Older operations may have left some rank's ring.
    first = max([min(records, default=last + 1)
                 for last, records in members.values()] + [1])
    end = max(last for last, _ in members.values())
    # Ranks without a file are suspects wherever the others stopped.
    present = [r for r in group if r in dumps]
    for seq in range(first, end + 1):
        reached = {r: m[1][seq] for r, m in members.items() if seq in m[1]}
        calls = collections.Counter(_call(rec) for rec in reached.values())
        if all(r in reached for r in present) and len(calls) == 1 and all(
                rec["state"] == "completed" for rec in reached.values()):
            continue
        expected = None
        if calls:
            top = calls.most_common()
            # A tie names every side as different.
            if len(top) == 1 or top[0][1] > top[1][1]:
                call = top[0][0]
                expected = next(rec for rec in reached.values()
                                if _call(rec) == call)
        same = {r: rec for r, rec in reached.items()
                if expected is not None and _call(rec) == _call(expected)}
        different = {r: rec for r, rec in reached.items() if r not in same}
        not_reached = [r for r in present if r not in reached
                       and (r not in members or members[r][0] < seq)]
        if not (different or not_reached) and all(
                rec["state"] == "completed" for rec in same.values()):
            continue  # a rank's record of it was lost (torn, recording off)
        last = {r: _last_operation(dumps[r])
                for r in sorted(set(different) | set(not_reached))}
        return Divergence(
            group=list(group), channel=channel, seq=seq, expected=expected,
            waiting=sorted(r for r, rec in same.items()
                           if rec["state"] != "completed"),
            completed=sorted(r for r, rec in same.items()
                             if rec["state"] == "completed"),
            not_reached=sorted(not_reached), different=different,
            no_record=[r for r in group if r not in dumps], last=last)
    return None


def analyze(dumps, world_size=None):
    """Finds where each group's ranks diverged.

    Args:
        dumps (dict): World rank -> its flight record, as :func:`load`
            returns.
        world_size (int): The job's ranks; by default the records' own
            figure.

    Returns:
        Analysis: Per group, the first operation not every rank
        completed, the group where one began first first.
    """
    if not dumps:
        raise ValueError("no flight records to analyze")
    # The directory may hold the files of earlier jobs, whose ranks this
    # job did not overwrite: the newest record's job is the one analyzed.
    job = max(dumps.values(), key=lambda d: d["time"]).get("job")
    other_job = sorted(r for r, d in dumps.items() if d.get("job") != job)
    dumps = {r: d for r, d in dumps.items() if d.get("job") == job}
    if world_size is None:
        world_size = max(d["world_size"] for d in dumps.values())
    groups = _groups(dumps)
    found = []
    for key, members in groups.items():
        d = _first_divergence(key, members, dumps)
        if d is not None:
            found.append(d)

    def began(d):
        members = groups[(tuple(d.group), d.channel)].values()
        return min((records[d.seq]["enqueued"] for _, records in members
                    if d.seq in records), default=float("inf"))
    found.sort(key=began)
    ranks = sorted(dumps)
    return Analysis(world_size=world_size, ranks=ranks,
                    missing=[r for r in range(world_size) if r not in dumps],
                    divergences=found, other_job=other_job)


def describe(record):
    """One operation, as the report names it: its number, the nncomm call,
    the MPI operation and its size, its state and the Python line."""
    call = record["call"] or record["op"]
    if record["phase"] == "call check":
        what = f"the check of {call}"
    else:
        what = f"{call} ({record['op']}"
        if record["bytes"]:
            what += f", {record['count']} x {record['dtype']}"
        what += ")"
    text = f"operation {record['seq']}: {what}, {record['state']}"
    if record["site"]:
        text += f", at {record['site']}"
    return text


def _ranks(ranks):
    return ", ".join(map(str, ranks))


def report(analysis, dumps):
    """The analysis as the command prints it: one screen.

    Args:
        analysis (Analysis): From :func:`analyze`.
        dumps (dict): The records it was made from.

    Returns:
        str: The text, lines ending in newlines.
    """
    out = []
    say = out.append
    say(f"flight records of world ranks {_ranks(analysis.ranks)} "
        f"(of {analysis.world_size})")
    for rank in analysis.ranks:
        d = dumps[rank]
        why = d["reason"]
        if d.get("first_reason"):
            why += f", after: {d['first_reason']}"
        say(f"  rank {rank} ({d['host']}, pid {d['pid']}): {why}")
    if analysis.other_job:
        say(f"  left out: the files of world ranks "
            f"{_ranks(analysis.other_job)}, which another job wrote "
            f"(earlier, into the same directory)")
    if analysis.missing:
        say(f"  no record from world ranks {_ranks(analysis.missing)}: "
            f"killed, or died before they could write one")
    if not analysis.divergences:
        say("no divergence: every rank completed every operation it "
            "recorded")
        return "\n".join(out) + "\n"
    for i, d in enumerate(analysis.divergences):
        say("")
        say(("first divergence" if i == 0 else "then") +
            f": group of world ranks [{_ranks(d.group)}]"
            + (f", channel {d.channel}" if d.channel else "")
            + f", operation {d.seq}")
        if d.expected is not None:
            say(f"  expected: {describe(d.expected)}")
        if d.completed:
            say(f"  completed by world ranks {_ranks(d.completed)}")
        if d.waiting:
            say(f"  waiting in it: world ranks {_ranks(d.waiting)}")
        for rank in d.no_record:
            say(f"  world rank {rank}: no record (killed, or died before "
                f"it could write one)")
        for rank in d.not_reached:
            say(f"  world rank {rank}: never reached it")
        for rank, record in sorted(d.different.items()):
            say(f"  world rank {rank}: made another call there: "
                f"{describe(record)}")
        for rank, last in d.last.items():
            if last is not None:
                group, channel, record = last
                say(f"    rank {rank}'s last operation: {describe(record)}"
                    f" (group [{_ranks(group)}]"
                    + (f", channel {channel}" if channel else "") + ")")
    culprits = _culprits(analysis.divergences[0])
    if culprits:
        say("")
        say(f"diverged first: world rank{'s' if len(culprits) > 1 else ''} "
            f"{_ranks(culprits)}")
    return "\n".join(out) + "\n"


def _culprits(divergence):
    """The ranks a divergence blames: those that did not come or came with
    another call."""
    return sorted(set(divergence.no_record) | set(divergence.not_reached)
                  | set(divergence.different))


def culprits(analysis):
    """
    Args:
        analysis (Analysis): From :func:`analyze`.

    Returns:
        list: The world ranks that diverged first (did not reach, or made
        another call at, the first divergence), or ``[]``.
    """
    if not analysis.divergences:
        return []
    return _culprits(analysis.divergences[0])


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m nncomm.flight",
        description="Which rank of a job diverged first, and where, from "
                    "the flight records its ranks wrote.")
    parser.add_argument("directory", help="NNCOMM_FLIGHT_RECORDER_DIR: "
                        "where the ranks wrote nncomm-flight-<rank>.json")
    parser.add_argument("--world-size", type=int, default=None,
                        help="the job's ranks (default: as recorded)")
    args = parser.parse_args(argv)
    try:
        dumps = load(args.directory)
    except (OSError, ValueError) as e:
        parser.error(str(e))
    sys.stdout.write(report(analyze(dumps, args.world_size), dumps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
