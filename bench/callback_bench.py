"""Overlap of gradient all-reduce with backward: ``all_reduce_callback``.

Run with two ranks (shared memory):

    OMP_NUM_THREADS=1 .venv/bin/mpiexec -n 2 .venv/bin/python \
        bench/callback_bench.py

or over an emulated 10 Gbit/s link between two "hosts" (TCP on a shaped
loopback in a private network namespace):

    bench/run_emulated_link.sh

The model is an MLP of 8 affine layers 2048x2048 with bias and ReLU (33.6 M
float32 parameters, 134 MB of gradients), batch 16 per rank, different inputs
on each rank, the same parameters, CPU context. In one run, interleaved round
by round so that machine noise hits all alike, it times one training step
without the solver:

- ``T_fb``: forward + backward, no communication (both ranks compute at once);
- ``T_comm``: ``comm.all_reduce(grads, division=True)`` alone (packed,
  ``inplace=False``) on the gradients of a finished backward;
- ``T_seq``: forward + backward, then that one packed all-reduce (no overlap);
- ``T_cb``: forward + ``backward(function_post_hook=cb)`` with
  ``cb = comm.all_reduce_callback(grads, pack_size, division=True)`` created
  once and reused;
- ``T_cb_new``: the same with a new callback every step, its creation timed
  (what nnabla-examples do);
- ``T_cb_cc``: ``T_cb`` with the callback passed as nnabla's scripts pass
  it, ``backward(communicator_callbacks=cb)`` (goal: within 2 % of
  ``T_cb``);
- ``T_cb_fwd`` (with ``--priority``): ``T_cb`` with
  ``priority="forward"``, the plan's buckets sorted so that those the next
  forward needs first go out first;
- ``T_cb_chk`` (with ``--check-finite``): ``T_cb`` with
  ``check_finite=True``, every gradient checked for NaN and infinity as it
  is packed (the same engine and schedule); the ratio ``T_cb_chk/T_cb`` is
  the check's cost (goal: at most 1.03);
- ``T_cb_join`` (with ``--join``): ``T_cb`` inside ``comm.join()``, which
  no rank leaves (opened before the round's steps, left after, neither
  timed); ``T_cb_join/T_cb`` is what being ready for uneven inputs costs
  while every rank still trains (goal: within 1 %);
- ``T_cb_tl`` (with ``--timeline PATH``): ``T_cb``, the same callback on
  the same schedule, with the timeline recording (``comm.start_timeline``
  before the round's steps, ``stop_timeline`` after, neither timed); the
  ratio ``T_cb_tl/T_cb`` is the timeline's cost, and PATH is left holding
  the last round's timeline (that of the hook overhead below goes beside
  it, ``<stem>-tiny<ext>``).
- ``T_cb/T_cb_nofr`` (with ``--flight-recorder``): after the rounds,
  ``--recorder-pairs`` pairs of adjacent ``T_cb`` steps, one with the
  flight recorder recording (the default) and one with it switched off,
  in alternating order; printed: the median of the pairs' ratios with a
  95 % bootstrap interval, and the ratio of the sums (goal: at most
  1.01). Adjacent steps share the machine's state, which rounds of
  several steps do not: rounds of one kind spread over 6-10 %.

The callback's engine chooses on its first iterations whether to launch
buckets as they become ready or all at the end of backward (``auto``, the
default; ``NNCOMM_LAUNCH=eager`` or ``deferred`` fixes it). The script runs
the callback until that choice is made, prints it, then times.

Before the rounds a "link check" times MPI's own ``Allreduce`` of as many
bytes on a numpy array (three times), to show what the transport gives, and
the CPU time it takes (``--only-link-check`` does only that).

Every step zeroes the gradients (as ``solver.zero_grad()`` does) and is
preceded by a barrier; a step's time is the slowest rank's. A round runs
``--iters`` steps of each kind and keeps their mean; the figures printed are
the median over ``--rounds`` rounds (the best round is printed alongside).
``cpu`` is the CPU time (user + system, all threads of the process) a rank
spent per step: where it is close to the wall time, the rank had no idle
CPU time in which communication could have been hidden.

Ratios: ``T_seq/T_fb``, ``T_cb/T_fb``, ``T_cb/max(T_fb, T_comm)`` and the
hidden fraction ``(T_fb + T_comm - T_cb) / min(T_fb, T_comm)``: 1 when the
shorter of compute and communication is wholly hidden, 0 when nothing is
(``T_cb = T_fb + T_comm``), negative when overlapping costs more than doing
the two one after the other.

Before and after the timing, the callback's gradients are checked against
``T_seq``'s (same inputs, same parameters): they must agree within float32
tolerance on every rank, else the script exits with status 1.

Then a breakdown of ``T_cb``: forward, backward outside the hook, time inside
the hook calls, and the last hook call, which waits for the engine to finish
the remaining buckets (the part of the communication left unhidden).

Last, the hook overhead: backward of a chain of ``--tiny-functions`` Add2
functions on a (4, 16) tensor, each adding its own (4, 16) parameter, timed
with no hook, with a trivial Python ``function_post_hook`` and with nncomm's
callback (with ``--timeline`` also with the timeline recording, a ready
instant per function; with ``--priority`` also ``priority="forward"``: with
``--pack-size 64`` a bucket per parameter, sent in the reverse of the
order backward makes them), in microseconds per function.

``--csv PATH`` also writes a step's breakdown per schedule (the medians),
for ``bench/plot.py``: columns schedule (``fb``, ``comm``, ``seq``, ``cb``,
...), step_ms, compute_ms, exposed_comm_ms and ranks. Compute is ``T_fb``,
the step without communication (none for ``comm``, the all-reduce alone),
and the exposed communication is the rest of the step: ``T_x - T_fb``,
negative where noise made a step faster than ``T_fb``.

Until nncomm has ``all_reduce_callback`` the callback figures are skipped
and said so.
"""
import argparse
import contextlib
import csv
import os
import resource
import statistics
import sys
import time

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import numpy as np
from mpi4py import MPI
from nnabla._variable import CommunicatorBackwardCallback
from nnabla.ext_utils import get_extension_context

import nncomm.communicators as C


def process_cpu():
    """User + system CPU seconds of this process, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def steal_seconds():
    """CPU time the hypervisor took from this machine so far (Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def slowest(seconds, world):
    """Every rank gets the slowest rank's time."""
    return world.allreduce(seconds, op=MPI.MAX)


def build_mlp(batch, width, layers, rank):
    rng = np.random.RandomState(1000 + rank)          # inputs differ by rank
    x = nn.Variable.from_numpy_array(
        rng.randn(batch, width).astype(np.float32))
    t = nn.Variable.from_numpy_array(
        rng.randn(batch, width).astype(np.float32))
    with nn.parameter_scope("mlp"):
        h = x
        for i in range(layers):
            h = F.relu(PF.affine(h, width, name=f"fc{i}"))
        loss = F.mean(F.squared_error(h, t))
        params = nn.get_parameters(grad_only=False)
    return loss, params


def build_chain(n, shape=(4, 16)):
    x = nn.Variable.from_numpy_array(np.random.RandomState(7).randn(
        *shape).astype(np.float32))
    h = x
    with nn.parameter_scope("tiny"):
        for i in range(n):
            p = nn.parameter.get_parameter_or_create(
                f"p{i}", shape, need_grad=True)
            p.d = 1e-3
            h = F.add2(h, p)
        loss = F.sum(h)
        params = nn.get_parameters(grad_only=False)
    return loss, params


def zero(params):
    for p in params.values():
        p.grad.zero()


def copy_grads(params):
    return [p.grad.get_data("r").copy() for p in params.values()]


def check(name, got, want, world, local=None):
    """Collective: every rank learns whether every rank agreed."""
    diff = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want))
    scale = max(float(np.max(np.abs(w))) for w in want)
    ok = all(np.allclose(g, w, rtol=1e-5, atol=1e-6 * scale)
             for g, w in zip(got, want))
    moved = None
    if local is not None:     # how far reduction moved the gradients
        moved = max(float(np.max(np.abs(l - w))) for l, w in zip(local, want))
    diff = world.allreduce(diff, op=MPI.MAX)
    all_ok = world.allreduce(int(ok), op=MPI.MIN)
    if world.rank == 0:
        extra = (f", local vs reduced max |diff| {moved:.3e}"
                 if moved is not None else "")
        print(f"# check {name}: max |cb - seq| = {diff:.3e} "
              f"(max |grad| {scale:.3e}{extra}) -> "
              f"{'OK' if all_ok else 'MISMATCH'}", flush=True)
    if not all_ok:
        if world.rank == 0:
            print(f"FAILED: {name}: callback gradients differ from "
                  f"backward + all_reduce", file=sys.stderr, flush=True)
        sys.exit(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=2,
                        help="steps of each kind per round")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--pack-size", type=int, default=2 << 20,
                        help="callback bucket size in ELEMENTS")
    parser.add_argument("--no-new-cb", action="store_true",
                        help="skip T_cb_new (a new callback every step)")
    parser.add_argument("--priority", action="store_true",
                        help="also time T_cb_fwd (priority='forward')")
    parser.add_argument("--check-finite", action="store_true",
                        help="also time T_cb_chk (check_finite=True)")
    parser.add_argument("--timeline", metavar="PATH",
                        help="also time T_cb_tl: T_cb with the timeline "
                        "recording into PATH")
    parser.add_argument("--join", action="store_true",
                        help="also time T_cb_join: T_cb inside comm.join()")
    parser.add_argument("--flight-recorder", action="store_true",
                        help="also time T_cb/T_cb_nofr: adjacent steps with "
                             "the flight recorder on and off")
    parser.add_argument("--recorder-pairs", type=int, default=60,
                        help="step pairs of --flight-recorder")
    parser.add_argument("--breakdown-steps", type=int, default=4,
                        help="steps of the T_cb breakdown (0: none)")
    parser.add_argument("--tiny-functions", type=int, default=1000)
    parser.add_argument("--tiny-iters", type=int, default=20)
    parser.add_argument("--tiny-rounds", type=int, default=5)
    parser.add_argument("--skip-tiny", action="store_true")
    parser.add_argument("--skip-mlp", action="store_true")
    parser.add_argument("--only-link-check", action="store_true",
                        help="time MPI's all-reduce of the model's size only")
    parser.add_argument("--csv", metavar="PATH",
                        help="also write the step breakdown to this CSV file")
    args = parser.parse_args()
    if args.csv and (args.skip_mlp or args.only_link_check):
        parser.error("--csv writes the MLP's figures: not with --skip-mlp "
                     "or --only-link-check")

    ctx = get_extension_context("cpu")
    nn.set_default_context(ctx)
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
    world = MPI.COMM_WORLD
    rank = comm.rank
    have_cb = hasattr(comm, "all_reduce_callback")

    def say(*a):
        if rank == 0:
            print(*a, flush=True)

    say(f"# {comm.size} ranks, nnabla {nn.__version__}, "
        f"all_reduce_callback: {'yes' if have_cb else 'NOT AVAILABLE'}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"NNCOMM_ENGINE_POLL_US="
        f"{os.environ.get('NNCOMM_ENGINE_POLL_US', 'unset')}, "
        "load average %.2f %.2f %.2f" % os.getloadavg())

    start, steal = time.perf_counter(), steal_seconds()
    if args.only_link_check:
        link_check(args.layers * (args.width + 1) * args.width, world, say)
        return
    if not args.skip_mlp:
        mlp(args, comm, world, have_cb, say)
    if not args.skip_tiny:
        tiny(args, comm, world, have_cb, say)
    say(f"# {time.perf_counter() - start:.0f} s; CPU stolen by the "
        f"hypervisor meanwhile {steal_seconds() - steal:.1f} s; "
        "load average %.2f %.2f %.2f" % os.getloadavg())


def scope_of(name, comm, args):
    """The context a round of `name` runs in: the timeline recording for
    ``cb_tl``, a join no rank leaves for ``cb_join``, else none."""
    if name == "cb_join":
        return comm.join([])
    return recording(comm, args.timeline if name == "cb_tl" else None)


def recording(comm, path):
    """A context in which the timeline records into `path` (None: a
    context that does nothing)."""
    if path is None:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def on():
        comm.start_timeline(path)
        try:
            yield
        finally:
            comm.stop_timeline()
    return on()


def recorder_cost(step, pairs, world, say):
    """T_cb/T_cb_nofr from `pairs` pairs of adjacent steps `step`, one
    with the flight recorder recording and one without, the order
    alternating so that a drift favours neither."""
    from nncomm._nncomm import _set_flight_recording
    on, off = [], []
    for i in range(pairs):
        for recording in ((True, False) if i % 2 == 0 else (False, True)):
            _set_flight_recording(recording)
            world.Barrier()
            start = time.perf_counter()
            step()
            (on if recording else off).append(
                slowest(time.perf_counter() - start, world))
    _set_flight_recording(True)
    ratios = np.array(on) / np.array(off)
    resampled = np.random.default_rng(0).choice(ratios, (2000, pairs))
    low, high = np.percentile(np.median(resampled, axis=1), [2.5, 97.5])
    say(f"# flight recorder: {pairs} pairs of adjacent T_cb steps, on "
        f"{np.median(on) * 1e3:.1f} ms, off {np.median(off) * 1e3:.1f} ms "
        f"(medians)")
    say("T_cb/T_cb_nofr (flight rec.)".ljust(29)
        + f"{np.median(ratios):6.3f}   95 % interval {low:.3f}-{high:.3f}, "
        f"ratio of the sums {sum(on) / sum(off):.3f}")


def link_check(count, world, say):
    """What the transport gives: MPI's own all-reduce of `count` float32 on
    a numpy array, no nnabla, three times; and the CPU time it takes."""
    raw = np.ones(count, np.float32)
    times, cpus = [], []
    for _ in range(3):
        world.Barrier()
        start, cpu_start = time.perf_counter(), process_cpu()
        world.Allreduce(MPI.IN_PLACE, raw)
        elapsed = time.perf_counter() - start
        used = process_cpu() - cpu_start
        times.append(slowest(elapsed, world))
        cpus.append(world.allreduce(used) / world.size)
    say(f"# link check: mpi4py Allreduce of {count * 4 / 1e6:.0f} MB: "
        + " ".join(f"{t * 1e3:.0f}" for t in times) + " ms, CPU per rank "
        + " ".join(f"{t * 1e3:.0f}" for t in cpus) + " ms")


def mlp(args, comm, world, have_cb, say):
    loss, params = build_mlp(args.batch, args.width, args.layers, comm.rank)
    comm.bcast([p.data for p in params.values()], src=0)
    grads = [p.grad for p in params.values()]
    nparams = sum(p.size for p in params.values())
    say(f"# MLP {args.layers} x affine {args.width}x{args.width}+bias, "
        f"{nparams / 1e6:.1f} M float32 params ({nparams * 4 / 1e6:.0f} MB), "
        f"batch {args.batch}/rank, pack_size {args.pack_size} elements")

    def fb():
        zero(params)
        loss.forward()
        loss.backward()

    def comm_only():
        comm.all_reduce(grads, division=True)

    def seq():
        fb()
        comm.all_reduce(grads, division=True)

    cb = (comm.all_reduce_callback(grads, args.pack_size, division=True)
          if have_cb else None)

    forward_first = (comm.all_reduce_callback(
        grads, args.pack_size, division=True, priority="forward")
        if have_cb and args.priority else None)

    checked = (comm.all_reduce_callback(
        grads, args.pack_size, division=True, check_finite=True)
        if have_cb and args.check_finite else None)

    def with_cb(hook=cb):
        zero(params)
        loss.forward()
        loss.backward(function_post_hook=hook)

    def with_forward_first():
        with_cb(forward_first)

    def with_check():
        with_cb(checked)

    def with_cc(hook=cb):
        zero(params)
        loss.forward()
        loss.backward(communicator_callbacks=hook)

    def with_new_cb():
        zero(params)
        loss.forward()
        fresh = comm.all_reduce_callback(
            [p.grad for p in params.values()], args.pack_size, division=True)
        loss.backward(function_post_hook=fresh)

    # Correctness: the callback's reduced gradients against backward then
    # all_reduce, on the same inputs and parameters.
    def verify(when):
        fb()
        local = copy_grads(params)
        comm.all_reduce(grads, division=True)
        want = copy_grads(params)
        with_cb()
        check(f"{when}, reused callback", copy_grads(params), want, world,
              local)
        with_cb()          # a second use of the same callback
        check(f"{when}, reused callback (again)", copy_grads(params), want,
              world)
        if not args.no_new_cb:
            with_new_cb()
            check(f"{when}, new callback", copy_grads(params), want, world)
        if have_cc:
            with_cc()
            check(f"{when}, communicator_callbacks=", copy_grads(params),
                  want, world)
        if forward_first is not None:
            with_forward_first()
            check(f"{when}, priority='forward'", copy_grads(params), want,
                  world)
        if checked is not None:
            with_check()
            check(f"{when}, check_finite=True", copy_grads(params), want,
                  world)

    methods = {"fb": fb, "comm": comm_only, "seq": seq}
    # nnabla's route takes only its own callback type, which nncomm's is
    # with the nnabla versions it knows.
    have_cc = have_cb and isinstance(cb, CommunicatorBackwardCallback)
    if have_cb:
        verify("before timing")
        # The engine times eager and deferred launching on its first
        # iterations (NNCOMM_LAUNCH=auto); a training loop is past that
        # after a few steps, so the timing starts once it has chosen.
        for name, hook in (("cb", cb), ("cb_fwd", forward_first)):
            steps = 0
            while hook is not None and hook.schedule == "tuning" and \
                    steps < 50:
                with_cb(hook)
                steps += 1
            if hook is not None:
                say(f"# launch schedule of T_{name}: {hook.schedule} "
                    f"(NNCOMM_LAUNCH="
                    f"{os.environ.get('NNCOMM_LAUNCH', 'unset')}; {steps} "
                    f"more steps of tuning before timing)")
        methods["cb"] = with_cb
        if checked is not None:
            methods["cb_chk"] = with_check   # beside T_cb: the same noise
        if have_cc:
            methods["cb_cc"] = with_cc
        if not args.no_new_cb:
            methods["cb_new"] = with_new_cb
        if forward_first is not None:
            methods["cb_fwd"] = with_forward_first
        if args.timeline:
            methods["cb_tl"] = with_cb
        if args.join:
            methods["cb_join"] = with_cb

    fb()                         # warm up: allocations, first-touch
    seq()
    link_check(nparams, world, say)
    rounds = {name: [] for name in methods}
    cpu = {name: [] for name in methods}
    for _ in range(args.rounds):
        for name, fn in methods.items():
            total = used = 0.0
            with scope_of(name, comm, args):
                for _ in range(args.iters):
                    world.Barrier()
                    start = time.perf_counter()
                    cpu_start = process_cpu()
                    fn()
                    used += process_cpu() - cpu_start
                    total += slowest(time.perf_counter() - start, world)
            rounds[name].append(total / args.iters)
            cpu[name].append(world.allreduce(used / args.iters) / world.size)
    if have_cb and args.flight_recorder:
        recorder_cost(with_cb, args.recorder_pairs, world, say)
    if have_cb:
        verify("after timing")

    med = {k: statistics.median(v) for k, v in rounds.items()}
    best = {k: min(v) for k, v in rounds.items()}
    say(f"# median (best) of {args.rounds} rounds x {args.iters} steps, "
        f"ms per step, slowest rank; cpu: CPU time (user + system, all "
        f"threads) per step and rank, median")
    for name in methods:
        say(f"T_{name:<7} {med[name] * 1e3:9.1f} ms   "
            f"({best[name] * 1e3:.1f})   "
            f"cpu {statistics.median(cpu[name]) * 1e3:5.0f} ms   rounds: "
            + " ".join(f"{t * 1e3:.0f}" for t in rounds[name]))

    def report(t, label):
        t_fb, t_comm = t["fb"], t["comm"]
        say(f"# ratios ({label})")
        say("T_seq/T_fb".ljust(29) + f"{t['seq'] / t_fb:6.3f}")
        for key in ("cb", "cb_new", "cb_fwd"):
            if key not in t:
                continue
            t_cb = t[key]
            hidden = (t_fb + t_comm - t_cb) / min(t_fb, t_comm)
            say(f"T_{key}/T_fb".ljust(29) + f"{t_cb / t_fb:6.3f}")
            say(f"T_{key}/max(T_fb,T_comm)".ljust(29)
                + f"{t_cb / max(t_fb, t_comm):6.3f}")
            say(f"hidden fraction ({key})".ljust(29) + f"{hidden:6.3f}")
        # (the variant timed, the ratio printed: its numerator and
        # denominator)
        for key, label, over, under in (
                ("cb_tl", "T_cb_tl/T_cb (timeline)", "cb_tl", "cb"),
                ("cb_chk", "T_cb_chk/T_cb (check_finite)", "cb_chk", "cb"),
                ("cb_join", "T_cb_join/T_cb (comm.join())", "cb_join", "cb"),
                ("cb_cc", "T_cb_cc/T_cb (nnabla's route)", "cb_cc", "cb")):
            if key in t:
                say(label.ljust(29) + f"{t[over] / t[under]:6.3f}")
        if "cb" not in t:
            say("T_cb: not measured (comm has no all_reduce_callback)")

    report(med, "medians")
    report(best, "best rounds")
    if args.csv and comm.rank == 0:
        write_breakdown(args.csv, med, comm.size)
    if have_cb and args.breakdown_steps > 0:
        breakdown(args, loss, params, cb, world, say)


def write_breakdown(path, seconds, ranks):
    """Writes each schedule's step as compute (`T_fb`) and exposed
    communication (the rest) to the CSV file `path`."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["schedule", "step_ms", "compute_ms", "exposed_comm_ms",
                      "ranks"])
        for name, t in seconds.items():
            compute = 0.0 if name == "comm" else seconds["fb"]
            out.writerow([name, t * 1e3, compute * 1e3,
                          (t - compute) * 1e3, ranks])


def breakdown(args, loss, params, cb, world, say):
    """Where T_cb's time goes: the callback wrapped in a timing hook."""
    inside = []

    def timed_cb(f):
        start = time.perf_counter()
        cb(f)
        inside.append(time.perf_counter() - start)

    rows = {k: [] for k in ("fb forward", "fb backward", "cb forward",
                            "cb backward outside hooks",
                            "cb in hooks before the last",
                            "cb last hook (engine tail)")}
    for _ in range(args.breakdown_steps):
        zero(params)
        world.Barrier()
        t0 = time.perf_counter()
        loss.forward()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        rows["fb forward"].append(t1 - t0)
        rows["fb backward"].append(t2 - t1)
        zero(params)
        inside.clear()
        world.Barrier()
        t0 = time.perf_counter()
        loss.forward()
        t1 = time.perf_counter()
        loss.backward(function_post_hook=timed_cb)
        t2 = time.perf_counter()
        rows["cb forward"].append(t1 - t0)
        rows["cb backward outside hooks"].append(t2 - t1 - sum(inside))
        rows["cb in hooks before the last"].append(sum(inside[:-1]))
        rows["cb last hook (engine tail)"].append(inside[-1])
    say(f"# breakdown, median of {args.breakdown_steps} steps, slowest "
        f"rank, ms: the last hook call waits for the engine's remaining "
        f"buckets")
    for name, values in rows.items():
        t = slowest(statistics.median(values), world)
        say(f"{name:<29} {t * 1e3:7.1f}")


def tiny(args, comm, world, have_cb, say):
    loss, params = build_chain(args.tiny_functions)
    comm.bcast([p.data for p in params.values()], src=0)
    grads = [p.grad for p in params.values()]
    nfunctions = args.tiny_functions + 1        # the Add2 chain and the sum

    loss.forward()
    hooks = {"none": None, "python": lambda f: None}
    if have_cb:
        hooks["nncomm"] = comm.all_reduce_callback(grads, args.pack_size,
                                                   division=True)
    if have_cb and args.timeline:
        hooks["timeline"] = hooks["nncomm"]   # timed while recording
    if have_cb and args.priority:
        hooks["forward"] = comm.all_reduce_callback(
            grads, args.pack_size, division=True, priority="forward")

    def timed(hook):
        total = 0.0
        for _ in range(args.tiny_iters):
            zero(params)
            world.Barrier()
            start = time.perf_counter()
            if hook is None:
                loss.backward()
            else:
                loss.backward(function_post_hook=hook)
            total += slowest(time.perf_counter() - start, world)
        return total / args.tiny_iters

    for hook in hooks.values():
        timed(hook)                            # warm up
    rounds = {name: [] for name in hooks}
    path = "%s-tiny%s" % os.path.splitext(args.timeline or "")
    for _ in range(args.tiny_rounds):
        for name, hook in hooks.items():
            with recording(comm, path if name == "timeline" else None):
                rounds[name].append(timed(hook))
    med = {k: statistics.median(v) for k, v in rounds.items()}
    best = {k: min(v) for k, v in rounds.items()}
    say(f"# hook overhead: backward of {args.tiny_functions} Add2 + 1 Sum on "
        f"(4, 16), {args.tiny_functions} parameters; median (best) of "
        f"{args.tiny_rounds} rounds x {args.tiny_iters} backwards, "
        f"us per function")
    for name in hooks:
        say(f"{name:<7} {med[name] / nfunctions * 1e6:7.2f} us/function   "
            f"({best[name] / nfunctions * 1e6:.2f})   "
            f"+{(med[name] - med['none']) / nfunctions * 1e6:.2f} over none")
    if not have_cb:
        say("nncomm: not measured (comm has no all_reduce_callback)")


if __name__ == "__main__":
    main()
