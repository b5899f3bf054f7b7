"""PyTorch's ResNet-50 on one GPU, 2 ranks: nncomm's gradient_reducer driven
by the real backward through autograd's hooks, against no overlap and
against DistributedDataParallel over gloo.

Needs an NVIDIA GPU, PyTorch with torchvision, mpi4py and nncomm built
with nvcc; nnabla is not needed (CuPy, where present, only describes the
GPU). Two ranks share the GPU (NCCL refuses two ranks on one device), so
the host-staged MPI transport runs, or CUDA IPC (``NNCOMM_GPU_TRANSPORT=ipc``,
what ``auto`` chooses there). From the repository root:

    NNCOMM_GPU_TRANSPORT=mpi mpiexec -n 2 python3 bench/gpu_torch_bench.py
    NNCOMM_GPU_TRANSPORT=ipc mpiexec -n 2 python3 bench/gpu_torch_bench.py

Each rank runs torchvision's ResNet-50 (random weights, the same on every
rank; 161 gradients, 25.6 M float32 values) on ``--batch`` (32) random
224 x 224 images and labels of its own, cross-entropy loss. Six steps,
taking turns iteration by iteration so that noise hits all alike; figures
are medians of ``--iters`` iterations after ``--warmup``:

- ``forward``: the forward alone (autograd recording, no backward);
- ``compute``: forward and backward, no reduction;
- ``comm``: ``comm.all_reduce(grads, division=True)`` alone (the fused
  list all-reduce of every gradient);
- ``serial``: forward and backward, then that all-reduce;
- ``nncomm``: forward and backward with ``gradient_reducer``: ``begin()``
  before, ``ready(i)`` from parameter i's post-accumulate-grad hook (on
  autograd's device thread, once backward has enqueued the gradient on
  PyTorch's stream, the legacy default stream that the tensors'
  stream-less ``__cuda_array_interface__`` stands for), ``finish()`` after
  backward;
- ``ddp``: ``DistributedDataParallel`` over gloo (what a PyTorch user has
  where NCCL refuses ranks sharing a GPU; ``broadcast_buffers=False``, as
  nncomm's step syncs no buffers) on a copy of the model, the same batch.

Every step but ``comm`` zeroes the gradients in place first (not to
None): the reducer holds the ``.grad`` tensors it was made with, and
autograd adds into a ``.grad`` that exists. The reducer plans its buckets
in the order the hooks fire in (observed once, rank 0's), and its launch
tuner's first iterations run before timing.

Goal: nncomm <= 1.1 x max(compute, comm). No reduction can start before
backward makes a gradient, so where comm is longer than backward, no
overlap beats forward + comm: the summary also gives nncomm over
max(compute, forward + comm), the bound of any overlap.

Before timing, with the same weights and a batch of its own per rank
(TF32 off, so that float32 tolerances hold): the gradients after the
reducer's ``finish()`` must equal bitwise ``comm.all_reduce(...,
division=True)`` of what backward handed the reducer (copied in the hooks,
since two backwards on a GPU need not agree bitwise), and DDP's (a mean as
well) must equal that within 1e-4 of each gradient's norm. The script
exits 1 when a check or a part fails; a missed goal is reported, not an
error. A part that raises is reported and the others go on; past
``--deadline`` seconds every rank prints its stacks and exits rather than
hang.

Every step ends with the device synchronised; times are wall-clock on
rank 0, the slowest rank's for each iteration. ``--device cpu`` runs the
parts that need no GPU: ``compute``, ``ddp`` and DDP's check against an
mpi4py mean (nncomm takes no host tensors of PyTorch's).
"""
import argparse
import datetime
import faulthandler
import functools
import os
import socket
import sys
import traceback
import types

from mpi4py import MPI

# nncomm's extension before PyTorch, which makes its own libcudart global:
# loaded after it, the CUDA runtime nncomm links statically would have its
# calls served by PyTorch's.
try:
    import nncomm._nncomm  # noqa: F401
except ImportError:
    pass  # --device cpu needs none of it; Communicator() raises it again
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchvision  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_timing import take_turns, world  # noqa: E402
from pack_bench import gpu_info  # noqa: E402

import nncomm  # noqa: E402

GOAL = 1.1
# Of a gradient's norm. DDP divides before summing and nncomm after, and
# each side ran a backward of its own (cuDNN's and the pooling layers'
# atomics need not add in the same order): float32 rounding, far below
# this, where a wrong reduction (a sum, a rank left out) is off by 0.5.
TOLERANCE = 1e-4
# The reducer's launch tuner times eager against deferred launches on its
# first iterations (include/nncomm/core/launch_tuner.hpp: 2 untimed, then 3
# of each).
TUNER_ITERATIONS = 8


def say(*lines):
    if world.rank == 0:
        print(*lines, sep="\n", flush=True)


class Parts:
    """Runs the benchmark's parts so that one's failure leaves the others'
    output: the exception is printed on the rank that raised it, and every
    rank learns which ranks failed."""

    def __init__(self):
        self.failed = []

    def run(self, name, fn, *args):
        """(ok, fn's result); not ok on every rank where any rank raised."""
        try:
            result, error = fn(*args), None
        except Exception as e:
            print(f"[rank {world.rank}] {name}:", file=sys.stderr)
            traceback.print_exc()
            sys.stderr.flush()
            result, error = None, f"{type(e).__name__}: {e}"
        errors = world.allgather(error)
        if any(errors):
            self.failed.append(name)
            say(f"{name} FAILED: " + "; ".join(
                f"rank {r}: {e}" for r, e in enumerate(errors) if e))
            return False, None
        return True, result


class Hooks:
    """Post-accumulate-grad hooks on every parameter, idle unless told:
    `order` (a list) records the order they fire in, `reducer` is made
    ready gradient by gradient, `snapshots` (a list) gets a copy of each
    gradient as the reducer is handed it."""

    def __init__(self, params):
        self.order = self.reducer = self.snapshots = None
        for i, p in enumerate(params):
            p.register_post_accumulate_grad_hook(
                functools.partial(self.hook, i))

    def hook(self, i, param):
        if self.order is not None:
            self.order.append(i)
        if self.reducer is not None:
            if self.snapshots is not None:
                # Enqueued on the gradient's stream before ready(), so it
                # copies what the reducer will read.
                self.snapshots[i] = param.grad.clone()
            self.reducer.ready(i)


def bitwise(got, expected, local):
    """(ok, what): whether `got` equals `expected` bit for bit, and differs
    from `local` (else both could have reduced nothing and still agree)."""
    n = len(got)
    differ = [i for i in range(n) if not torch.equal(
        got[i].view(torch.int32), expected[i].view(torch.int32))]
    changed = world.size == 1 or any(
        not torch.equal(a, b) for a, b in zip(got, local))
    what = f"{n - len(differ)} of {n} gradients equal"
    if differ:
        largest = max((got[i] - expected[i]).abs().max().item()
                      for i in differ)
        what += f", first unequal {differ[:5]}, largest difference " \
                f"{largest:.3g}"
    if not changed:
        what += "; NOTHING was reduced"
    return not differ and changed, what


class Bench:
    """The model, its twin under DDP, one batch, and each method's step."""

    def __init__(self, args, device, comm):
        self.args, self.device, self.comm = args, device, comm
        torch.manual_seed(args.seed)  # the same weights on every rank
        model = torchvision.models.resnet50(weights=None)
        twin = torchvision.models.resnet50(weights=None)
        twin.load_state_dict(model.state_dict())
        self.model, self.twin = model.to(device), twin.to(device)
        self.params = list(self.model.parameters())
        twin_params = list(self.twin.parameters())
        # Made once: the reducer reads these every iteration.
        for p in self.params + twin_params:
            p.grad = torch.zeros_like(p)
        self.grads = [p.grad for p in self.params]
        self.twin_grads = [p.grad for p in twin_params]
        self.hooks = Hooks(self.params)
        g = torch.Generator().manual_seed(args.seed + 1 + world.rank)
        size = args.image_size
        self.x = torch.randn(args.batch, 3, size, size, generator=g).to(device)
        self.y = torch.randint(0, 1000, (args.batch,), generator=g).to(device)
        self.reducer = self.ddp = None

    def backward(self, net):
        F.cross_entropy(net(self.x), self.y).backward()

    def forward(self):
        F.cross_entropy(self.model(self.x), self.y)

    def compute(self):
        torch._foreach_zero_(self.grads)
        self.backward(self.model)

    def all_reduce(self):
        self.comm.all_reduce(self.grads, division=True)

    def serial(self):
        self.compute()
        self.all_reduce()

    def reduced(self):
        torch._foreach_zero_(self.grads)
        # An exception fails the iteration on every rank, so none waits.
        with self.reducer:
            self.hooks.reducer = self.reducer
            try:
                self.backward(self.model)
            finally:
                self.hooks.reducer = None

    def data_parallel(self):
        torch._foreach_zero_(self.twin_grads)
        self.backward(self.ddp)

    def mean(self, tensors):
        """The mean over the ranks, in place, by a plain all-reduce."""
        if self.comm is not None:
            self.comm.all_reduce(tensors, division=True)
            return
        for t in tensors:
            host = t.numpy()
            world.Allreduce(MPI.IN_PLACE, host)
            t.div_(world.size)

    # The parts, each run by Parts.

    def observe_order(self):
        self.hooks.order = []
        try:
            self.compute()
            order = self.hooks.order
        finally:
            self.hooks.order = None
        return world.bcast(order)

    def make_reducer(self, order):
        self.reducer = self.comm.gradient_reducer(
            self.grads, self.args.pack_size, division=True, order=order)

    def make_ddp(self):
        port = None
        if world.rank == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        port = world.bcast(port)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}",
            rank=world.rank, world_size=world.size,
            timeout=datetime.timedelta(seconds=120))
        self.ddp = torch.nn.parallel.DistributedDataParallel(
            self.twin, broadcast_buffers=False,
            bucket_cap_mb=self.args.ddp_bucket_mb,
            device_ids=[self.device.index] if self.device.type == "cuda"
            else None)

    def check_reducer(self):
        """(ok, what, the mean): the reducer's gradients against
        comm.all_reduce of the gradients the hooks handed it."""
        n = len(self.grads)
        self.hooks.snapshots = [None] * n
        try:
            self.reduced()
        finally:
            local, self.hooks.snapshots = self.hooks.snapshots, None
        got = [g.clone() for g in self.grads]
        unseen = [i for i, s in enumerate(local) if s is None]
        moved = [i for i, (p, g) in enumerate(zip(self.params, self.grads))
                 if p.grad is None or p.grad.data_ptr() != g.data_ptr()]
        if unseen or moved:
            return (False, f"no hook for gradients {unseen}, .grad "
                           f"replaced for {moved}", None)
        expected = [s.clone() for s in local]
        self.mean(expected)
        return bitwise(got, expected, local) + (expected,)

    def plain_mean(self):
        """compute, then the mean of its gradients by a plain all-reduce."""
        self.compute()
        expected = [g.clone() for g in self.grads]
        self.mean(expected)
        return expected

    def check_ddp(self, expected):
        """(ok, what): DDP's gradients against `expected`."""
        self.data_parallel()
        errors = [((p.grad - e).norm() / e.norm().clamp_min(1e-30)).item()
                  for p, e in zip(self.twin.parameters(), expected)]
        worst = max(range(len(errors)), key=errors.__getitem__)
        return (errors[worst] <= TOLERANCE,
                f"worst relative error {errors[worst]:.2e} (gradient "
                f"{worst}), tolerance {TOLERANCE:.0e}")

    def tune(self):
        for _ in range(TUNER_ITERATIONS):
            self.reduced()
        return len(self.reducer.launch_order)

    def close(self):
        # Before MPI is finalised at exit: the reducer has a thread and a
        # communicator of its own.
        self.reducer = self.ddp = None
        if dist.is_initialized():
            dist.destroy_process_group()


def describe(device, local_size):
    lines = []
    if device.type == "cuda":
        try:
            import cupy
            cupy.cuda.Device(device.index).use()
            lines.append(gpu_info(cupy))
        except Exception as e:
            p = torch.cuda.get_device_properties(device)
            lines.append(f"{p.name} ({p.total_memory / 2**30:.0f} GiB; "
                         f"CuPy's description failed: {e!r})")
        lines[-1] += (f"; {world.size} ranks, {local_size} on this host, "
                      f"transport "
                      f"{os.environ.get('NNCOMM_GPU_TRANSPORT', 'auto')}, "
                      f"launch {os.environ.get('NNCOMM_LAUNCH', 'auto')}")
        lines.append(f"torch {torch.__version__} (CUDA {torch.version.cuda}, "
                     f"cuDNN {torch.backends.cudnn.version()}), "
                     f"torchvision {torchvision.__version__}, "
                     f"nncomm {nncomm.__version__}, "
                     f"{MPI.Get_library_version().splitlines()[0].strip()}")
    else:
        lines.append(f"CPU, {torch.get_num_threads()} threads per rank; "
                     f"{world.size} ranks; torch {torch.__version__}, "
                     f"torchvision {torchvision.__version__}")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32,
                        help="images per rank")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--pack-size", type=int, default=2 << 20,
                        help="elements per bucket of the reducer (default "
                             "2 << 20, nnabla's and DistributedSolver's)")
    parser.add_argument("--ddp-bucket-mb", type=float, default=25,
                        help="DDP's bucket_cap_mb (default 25, DDP's)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline", type=float, default=300,
                        help="seconds after which every rank prints its "
                             "stacks and exits, rather than hang")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.deadline, exit=True)

    local_size = world.Split_type(MPI.COMM_TYPE_SHARED).size
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_size))
    comm = None
    if args.device == "cuda":
        comm = nncomm.Communicator(
            types.SimpleNamespace(backend=["cpu:float"]))
        comm.init()
        device = torch.device(
            "cuda", comm.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
        synchronize = torch.cuda.synchronize
    else:
        device = torch.device("cpu")

        def synchronize():
            pass

    if world.rank == 0:
        say(*describe(device, local_size))
    failed = run(args, device, comm, synchronize)
    faulthandler.cancel_dump_traceback_later()
    if failed:
        sys.exit(1)


def run(args, device, comm, synchronize):
    """The benchmark's parts on `device`, nncomm's where `comm` is given;
    whether a part or a check failed."""
    bench = Bench(args, device, comm)
    n = len(bench.grads)
    say(f"ResNet-50: {n} gradients, "
        f"{sum(g.numel() for g in bench.grads) / 1e6:.1f} M float32; "
        f"batch {args.batch} x 3 x {args.image_size}^2 per rank; "
        f"pack_size {args.pack_size}; DDP over gloo, bucket_cap_mb "
        f"{args.ddp_bucket_mb:g}")

    parts = Parts()
    ok, order = parts.run("backward's order", bench.observe_order)
    if ok and sorted(order) != list(range(n)):
        say(f"hooks: {len(order)} fired for {len(set(order))} of the {n} "
            f"parameters; the reducer plans in their reverse order")
        ok = False
    elif ok:
        off = sum(a != b for a, b in zip(order, reversed(range(n))))
        say(f"hooks: each fired once, in the parameters' reverse order at "
            f"{n - off} of {n} places; the reducer plans in theirs")
    if not ok:
        order = None
    if comm is not None:
        if not parts.run("gradient_reducer", bench.make_reducer, order)[0]:
            bench.reducer = None
    if not parts.run("DDP over gloo", bench.make_ddp)[0]:
        bench.ddp = None

    # TF32 off, so that float32's tolerance holds against DDP.
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    checks = {}
    expected = None
    if bench.reducer is not None:
        ok, result = parts.run("nncomm's check", bench.check_reducer)
        if ok:
            checks["nncomm == comm.all_reduce of backward's gradients, "
                   "bitwise"] = result[:2]
            expected = result[2]
        else:
            bench.reducer = None
    if bench.ddp is not None:
        label = "ddp == the same mean, within float32"
        if expected is None:
            label = "ddp == compute and a plain mean, within float32"
            ok, expected = parts.run("compute and a plain mean",
                                     bench.plain_mean)
        if expected is not None:
            ok, result = parts.run("ddp's check", bench.check_ddp, expected)
            if ok:
                checks[label] = result
            else:
                bench.ddp = None
    torch.backends.cudnn.allow_tf32 = tf32
    checks_failed = report_checks(checks)

    if bench.reducer is not None:
        ok, buckets = parts.run("reducer's first iterations", bench.tune)
        if ok:
            say(f"reducer: {buckets} buckets; its first "
                f"{TUNER_ITERATIONS} iterations (launch tuning) done")
        else:
            bench.reducer = None

    methods = {"forward": bench.forward, "compute": bench.compute}
    if comm is not None:
        methods.update(comm=bench.all_reduce, serial=bench.serial)
    if bench.reducer is not None:
        methods["nncomm"] = bench.reduced
    if bench.ddp is not None:
        methods["ddp"] = bench.data_parallel
    ok, t = parts.run("timing", take_turns, methods, args, synchronize)
    if ok and world.rank == 0:
        summary(t, torch.cuda.get_device_name(device)
                if device.type == "cuda" else "CPU", args, checks_failed)
    bench.close()

    failed = parts.failed + ["checks"] * checks_failed
    if failed:
        say(f"gpu_torch_bench: FAILED: {', '.join(failed)}")
    return bool(failed)


def report_checks(checks):
    """Prints each rank's checks from rank 0; whether one failed."""
    said = world.gather(checks)
    failed = world.allreduce(not all(ok for ok, _ in checks.values()),
                             op=MPI.LOR)
    if world.rank == 0 and checks:
        print("checks (TF32 off, a batch of its own per rank):")
        for label, (_, what) in checks.items():
            bad = [f"rank {r}: {c[label][1]}" for r, c in enumerate(said)
                   if not c[label][0]]
            print(f"  {label}: "
                  + (f"FAILED ({'; '.join(bad)})" if bad else f"ok ({what})"))
        sys.stdout.flush()
    return failed


def summary(t, device_name, args, checks_failed):
    base = [k for k in ("compute", "comm") if k in t]
    bound = max(t[k] for k in base)
    name = f"max({', '.join(base)})" if len(base) > 1 else base[0]
    print(f"summary: {device_name}, {world.size} ranks, ResNet-50 batch "
          f"{args.batch} per rank, pack_size {args.pack_size}; per step, "
          f"medians of {args.iters} after {args.warmup} warm-up, the "
          f"slowest rank's")
    print(f"  {'method':8s} {'ms':>9s}   / {name}")
    for key, seconds in t.items():
        print(f"  {key:8s} {seconds * 1e3:9.2f}   {seconds / bound:.3f}")
    if "nncomm" in t:
        r = t["nncomm"] / bound
        print(f"  nncomm / {name} = {r:.3f} (goal <= {GOAL}: "
              f"{'met' if r <= GOAL else 'NOT met'})")
    ratios = [f"{key} / {name} = {t[key] / bound:.3f}"
              for key in ("serial", "ddp") if key in t]
    if "nncomm" in t and "ddp" in t:
        ratios.append(f"nncomm / ddp = {t['nncomm'] / t['ddp']:.3f}")
    if ratios:
        print(f"  {'; '.join(ratios)}")
    if all(k in t for k in ("nncomm", "forward", "compute", "comm")):
        overlap = max(t["compute"], t["forward"] + t["comm"])
        print(f"  bound of any overlap, max(compute, forward + comm) = "
              f"{overlap * 1e3:.2f} ms; nncomm / it = "
              f"{t['nncomm'] / overlap:.3f}")
    print(f"  checks: {'FAILED (above)' if checks_failed else 'ok'}",
          flush=True)


if __name__ == "__main__":
    main()
