"""What a timeline says of each rank's iterations, in numbers: how long the
framework waited for its communicator after backward, and on a GPU, where
the device's time went between the first bucket's gradients and the last
bucket's write-back (the timeline's ``device`` track). A trace of a few
iterations answers "how much of the step does communication add, and which
buckets add it" without opening a viewer::

    python -m nncomm.timeline summary timeline.json [--buckets]
"""
import collections
import statistics

# The device track's spans of one bucket, in the order they run.
_DEVICE_STEPS = ("wait_gradients", "pack", "reduce", "unpack")

Rank = collections.namedtuple("Rank", ["host", "device", "collectives"])
Rank.__doc__ = """What one rank recorded: its engine iterations on the host
(:obj:`Host`) and on the device (:obj:`Device`), each None where there was
none, and ``collectives``, per collective's name (``all_reduce``, ...) a
pair: how many calls, and their time summed (microseconds), those started
with ``async_op=True`` included."""

Host = collections.namedtuple("Host", ["iterations", "backward",
                                       "wait_engine"])
Host.__doc__ = """A rank's engine iterations on the host (microseconds, the
median over ``iterations``): ``backward`` from the first gradient handed to
the engine to the end of its finish, ``wait_engine`` the part of it the
framework's thread waited for the engine after the last gradient."""

Device = collections.namedtuple("Device", [
    "iterations", "span", "gradients", "tail", "wait_gradients", "pack",
    "reduce", "unpack", "reduce_after", "buckets"])
Device.__doc__ = """A rank's GPU engine iterations in the device's time
(microseconds, each the median over ``iterations``): ``span`` from the
first bucket's wait for its gradients to the end of the last span,
``gradients`` when the last bucket's gradients were done (from the span's
start), ``tail`` what comes after that, ``wait_gradients``, ``pack``,
``reduce`` and ``unpack`` each step's time summed over the buckets,
``reduce_after`` the reduce time within the tail, and ``buckets`` per
bucket index a :obj:`Bucket`."""

Bucket = collections.namedtuple("Bucket", ["bytes", "ready", "pack",
                                           "reduce", "unpack"])
Bucket.__doc__ = """One bucket of the device track (microseconds, medians):
``ready`` when its gradients were done from its iteration's start, then
its steps' durations (0 for a bucket reduced where it lies, which has no
``pack`` or ``unpack``)."""


def _median(values):
    return statistics.median(values) if values else 0.0


def _end(event):
    return event["ts"] + event.get("dur", 0)


def device_iterations(events):
    """Splits one rank's device spans into iterations: a rank writes an
    iteration's spans together, bucket by bucket, so a bucket seen again
    (after another, or a step of it seen again) begins the next iteration.

    Args:
        events (list of dict): One rank's ``device`` events, in the file's
            order.

    Returns:
        list of dict: Per iteration, bucket index -> {step name: event}.
    """
    iterations = []
    current = {}
    last = None
    for e in events:
        bucket = e["args"]["bucket"]
        if bucket in current and (bucket != last or
                                  e["name"] in current[bucket]):
            iterations.append(current)
            current = {}
        current.setdefault(bucket, {})[e["name"]] = e
        last = bucket
    if current:
        iterations.append(current)
    return iterations


def _device(iterations):
    per = collections.defaultdict(list)
    per_bucket = collections.defaultdict(lambda: collections.defaultdict(list))
    for buckets in iterations:
        spans = [e for steps in buckets.values() for e in steps.values()]
        start = min(e["ts"] for e in spans)
        end = max(_end(e) for e in spans)
        waits = [steps["wait_gradients"] for steps in buckets.values()
                 if "wait_gradients" in steps]
        done = max((_end(e) for e in waits), default=start)
        per["span"].append(end - start)
        per["gradients"].append(done - start)
        per["tail"].append(end - done)
        for name in _DEVICE_STEPS:
            per[name].append(sum(steps[name].get("dur", 0)
                                 for steps in buckets.values()
                                 if name in steps))
        per["reduce_after"].append(sum(
            max(0, _end(steps["reduce"]) - max(done, steps["reduce"]["ts"]))
            for steps in buckets.values() if "reduce" in steps))
        for index, steps in buckets.items():
            b = per_bucket[index]
            b["bytes"].append(next(iter(steps.values()))["args"].get(
                "bytes", -1))
            if "wait_gradients" in steps:
                b["ready"].append(_end(steps["wait_gradients"]) - start)
            for name in _DEVICE_STEPS[1:]:
                b[name].append(steps[name]["dur"] if name in steps else 0)
    buckets = {
        index: Bucket(max(b["bytes"]), _median(b["ready"]),
                      _median(b["pack"]), _median(b["reduce"]),
                      _median(b["unpack"]))
        for index, b in sorted(per_bucket.items())}
    return Device(len(iterations), **{k: _median(v) for k, v in per.items()},
                  buckets=buckets)


def summarize(events):
    """Per rank, its iterations and collectives.

    Args:
        events (list of dict): A timeline's events
            (:func:`nncomm.timeline.load`).

    Returns:
        dict: World rank -> :obj:`Rank`, for each rank that recorded an
        iteration or a collective.

    Example:

    .. code-block:: python

        from nncomm import timeline, timeline_summary
        ranks = timeline_summary.summarize(timeline.load("timeline.json"))
        print(ranks[0].device.tail / 1000, "ms of the device's step after "
              "backward")
    """
    backward = collections.defaultdict(lambda: collections.defaultdict(list))
    device = collections.defaultdict(list)
    collectives = collections.defaultdict(dict)
    for e in events:
        if e.get("ph") != "X":
            continue
        if e.get("cat") == "backward":
            backward[e["pid"]][e["name"]].append(e["dur"])
        elif e.get("cat") == "device":
            device[e["pid"]].append(e)
        elif e.get("cat") in ("collectives", "async"):
            calls, time = collectives[e["pid"]].get(e["name"], (0, 0))
            collectives[e["pid"]][e["name"]] = (calls + 1, time + e["dur"])
    out = {}
    for rank in sorted(set(backward) | set(device) | set(collectives)):
        spans = backward[rank]
        host = None
        if spans["backward"]:
            host = Host(len(spans["backward"]), _median(spans["backward"]),
                        _median(spans["wait_engine"]))
        out[rank] = Rank(host, _device(device_iterations(device[rank]))
                         if device[rank] else None, collectives[rank])
    return out


def report(events, buckets=False):
    """:func:`summarize`'s numbers as text, in milliseconds.

    Args:
        events (list of dict): A timeline's events.
        buckets (bool): Also a line per bucket of the device track.

    Returns:
        str: The report.
    """
    lines = []
    ms = 1e-3
    for rank, (host, device, collectives) in summarize(events).items():
        lines.append(f"rank {rank}:")
        if collectives:
            lines.append("  collectives: " + ", ".join(
                f"{name} {calls} calls in {time * ms:.3f}"
                for name, (calls, time) in sorted(collectives.items())))
        if host:
            lines.append(
                f"  host, {host.iterations} iterations (medians, ms): "
                f"backward {host.backward * ms:.3f}, the framework waiting "
                f"for the engine after it {host.wait_engine * ms:.3f}")
        if device:
            d = device
            lines.append(
                f"  device, {d.iterations} iterations (medians, ms): span "
                f"{d.span * ms:.3f}, last gradients at {d.gradients * ms:.3f}"
                f", then {d.tail * ms:.3f} (reduce {d.reduce_after * ms:.3f}"
                f" of it); summed over buckets: wait_gradients "
                f"{d.wait_gradients * ms:.3f}, pack {d.pack * ms:.3f}, "
                f"reduce {d.reduce * ms:.3f}, unpack {d.unpack * ms:.3f}")
            if buckets:
                lines.append("    bucket      bytes   ready    pack  reduce"
                             "  unpack")
                for index, b in d.buckets.items():
                    lines.append(
                        f"    {index:6d} {b.bytes:10d} {b.ready * ms:7.3f} "
                        f"{b.pack * ms:7.3f} {b.reduce * ms:7.3f} "
                        f"{b.unpack * ms:7.3f}")
    return "\n".join(lines) if lines else "no iterations or collectives " \
        "recorded"
