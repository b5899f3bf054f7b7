"""Waits for other ranks are bounded, report stalls and let Ctrl-C through.

Run by tests/test_waits.py as ``waits.py MODE OP TOKEN``: the LAST rank
misbehaves at operation OP (all_reduce, callback, barrier, init, bcast,
reduce, all_gather, communicator, new_group, timeline) as MODE says, the other ranks do OP normally:

- stall: the last rank comes 3.5 s late (run with NNCOMM_STALL_WARNING=1);
  the results are still checked, and the test reads rank 0's stall
  reports on stderr.
- timeout: the last rank sleeps instead (run with a small NNCOMM_TIMEOUT);
  each other rank prints the CommunicatorError it gets and re-raises it.
- interrupt: the last rank sleeps; rank 0 sends itself SIGINT one second
  into its wait and prints how long KeyboardInterrupt took to come, then
  what a later collective raises.
- kill: the last rank SIGKILLs itself during a callback backward (OP is
  'callback').
- raise: the last rank's script ends with an exception instead (under
  plain mpiexec: its process would wait in MPI_Finalize, and the others in
  OP until NNCOMM_TIMEOUT, but for nncomm's sys.excepthook).
- exit: the last rank's script ends before operation OP, with
  sys.exit(0) before an all_reduce (a rank with fewer batches), sys.exit(3)
  before a callback backward (one that gave up: under plain mpiexec, since
  mpi4py's runner aborts the job on a non-zero code itself), MPI.Finalize()
  then sys.exit(0) before a barrier, sys.exit(0) before the others make a
  second communicator (OP 'communicator'), a group (OP 'new_group') or
  start a timeline (OP 'timeline');
  each other rank prints the
  CommunicatorError it gets and re-raises it.
- finish: the last rank comes 3.5 s late (as in stall) to a bcast of
  64 KiB or a reduce, rooted at rank 0, made once in time before (so that
  it is not compared again); every rank ends as soon as its own
  part is done, rank 1 long before the root, and prints whether its result
  is right. A rank that made the call and ended is no cause for the
  others' waits to fail.
- mismatch: every rank must learn that the calls differ, from the stall
  reports or a comparison. OP 'all_reduce': after an all_reduce of 4
  elements everywhere, the last rank makes one of 6 (a call it never made:
  compared across the ranks first) while the others make the one of 4
  again (not compared again). OP 'large': after calls of 4 elements and of
  4 MiB everywhere, the last rank makes the small one while the others make
  the large one, which is compared every time. OP 'sampled': after
  all_reduces of 4 elements in place and not, the last rank makes the one
  in place while the others make the other (the same MPI call), then every
  rank the one not in place, up to 5000 times: about one call in 128 is
  compared again. OP 'skipped': the last rank skips one of two all_reduces
  made at every step, each compared at the first step: the rank left
  waiting and the ranks gone ahead learn it from the calls the others'
  reports say they made before. OP 'callback': after a callback backward everywhere, the
  last rank makes a plain backward and an all_reduce of the gradients while
  the others make the callback backward again (whose plan, reused, is
  agreed on the group's communicator, where the all_reduce meets it). OP
  'async': the last rank makes blocking an all_reduce the others start with
  async_op=True (run with a small NNCOMM_TIMEOUT: the ranks wait on two
  communicators, and the others' messages name their queue).

TOKEN only marks the processes, so that the test can check none is left.
"""
import os
import signal
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

import nncomm

from _harness import (Checker, exception_chain, make_comm, nd,
                      three_layer_mlp)

MODE, OP = sys.argv[1], sys.argv[2]


def say(text):
    # One write per line: the ranks' outputs are merged. Then a pause
    # before the exception goes on to the mpi4py runner, whose MPI_Abort
    # would stop the other ranks before they could report theirs.
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    time.sleep(1)


def misbehave():
    """What the last rank does instead of operation OP."""
    if MODE in ("stall", "finish"):
        time.sleep(3.5)
    elif MODE in ("timeout", "interrupt"):
        time.sleep(60)  # the job is aborted long before
    elif MODE == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif MODE == "raise":
        raise RuntimeError("the last rank's script fails")


def sigint_soon(delay=1.0):
    """SIGINT to this process's main thread in `delay` s; returns the time
    it was sent (a list, filled then)."""
    sent = []
    main = threading.main_thread().ident

    def send():
        time.sleep(delay)
        sent.append(time.monotonic())
        signal.pthread_kill(main, signal.SIGINT)
    threading.Thread(target=send, daemon=True).start()
    return sent


def run_op(comm, late):
    """Operation OP on every rank; the last rank misbehaves first
    (`late`). Returns what to check, or None."""
    n, r = comm.size, comm.rank
    if MODE == "mismatch" and OP == "all_reduce":
        comm.all_reduce(nd(np.ones(4, np.float32)))
        comm.all_reduce(nd(np.ones(6 if late else 4, np.float32)))
        return None
    if MODE == "mismatch" and OP == "large":
        small, large = nd(np.ones(4, np.float32)), nd(np.ones(1 << 20,
                                                              np.float32))
        comm.all_reduce(small)
        comm.all_reduce(large)
        comm.all_reduce(small if late else large)
        return None
    if MODE == "mismatch" and OP == "sampled":
        x = nd(np.ones(4, np.float32))
        comm.all_reduce(x, inplace=True)
        comm.all_reduce(x, inplace=False)
        comm.all_reduce(x, inplace=late)
        for _ in range(5000):
            comm.all_reduce(x, inplace=False)
        return None
    if MODE == "mismatch" and OP == "skipped":
        # Two lists reduced at every step (a GAN's two networks); at the
        # second the last rank skips the first (a branch one rank takes):
        # every call has been compared before, and the ranks' calls pair
        # one apart from then on, until a pair cannot complete.
        first = [nd(np.ones(k, np.float32)) for k in (1000, 10)]
        second = [nd(np.ones(k, np.float32)) for k in (5, 7, 3)]
        for step in range(4):
            if not (late and step == 1):
                comm.all_reduce(first)
            comm.all_reduce(second)
        return None
    if MODE == "mismatch" and OP == "async":
        # The last rank makes blocking the all_reduce the others start with
        # async_op=True: calls on two communicators, which wait for each
        # other until NNCOMM_TIMEOUT (run with a small one).
        x = nd(np.ones(4, np.float32))
        comm.all_reduce(x, async_op=True).wait()  # every rank's queue
        if late:
            comm.all_reduce(x)
        else:
            comm.all_reduce(x, async_op=True).wait()
        return None
    if MODE == "mismatch" and OP == "callback":
        x, t, loss, _, params = three_layer_mlp(41)
        x.d = np.full(x.shape, r + 1.0, np.float32)
        t.d = 0
        grads = [p.grad for p in params]
        for step in range(2):
            loss.forward()
            if late and step == 1:
                loss.backward()
                comm.all_reduce(grads)
            else:
                loss.backward(
                    function_post_hook=comm.all_reduce_callback(grads, 4))
        return None
    if OP == "all_reduce":
        if late:
            misbehave()
        x = nd(np.full(5, r + 1.0, np.float32))
        comm.all_reduce(x)
        return x, np.full(5, n * (n + 1) / 2, np.float32)
    if OP == "bcast":
        if late:
            misbehave()
        x = nd(np.full(1 << 14, r, np.float32))
        comm.bcast(x, src=0)
        return x, np.zeros(1 << 14, np.float32)
    if OP == "reduce":
        if late:
            misbehave()
        x = nd(np.full(4, r + 1.0, np.float32))
        comm.reduce(x, 0)
        return (x, np.full(4, n * (n + 1) / 2, np.float32)) if r == 0 \
            else None
    if OP == "all_gather":
        if late:
            misbehave()
        out = nd(np.zeros(2 * n, np.float32))
        comm.all_gather(nd(np.full(2, r, np.float32)), out)
        return out, np.repeat(np.arange(n, dtype=np.float32), 2)
    if OP == "barrier":
        if late:
            misbehave()
        comm.barrier()
        return None
    if OP == "communicator":  # a second one
        make_comm()
        return None
    if OP == "new_group":
        comm.new_group(("all", list(range(n))))
        return None
    if OP == "timeline":
        comm.start_timeline(os.path.join("/tmp", f"waits-{sys.argv[3]}.json"))
        return None
    if OP == "callback":
        x, t, loss, _, params = three_layer_mlp(41)
        x.d = np.full(x.shape, r + 1.0, np.float32)
        t.d = 0
        calls = [0]

        def hook(f):
            calls[0] += 1
            if late and calls[0] == 3:
                misbehave()
        cb = comm.all_reduce_callback([p.grad for p in params], 4)
        loss.forward()
        loss.backward(function_post_hook=nncomm.chain_hooks(hook, cb))
        # Reduced: the same on every rank, though the inputs differ.
        mine = np.concatenate([p.g.ravel() for p in params])
        return nd(mine), MPI.COMM_WORLD.bcast(mine, root=0)
    raise ValueError(OP)


def main():
    n = MPI.COMM_WORLD.size
    late = MPI.COMM_WORLD.rank == n - 1
    # The punctual ranks start their waits together, so that they time out
    # together (ranks start up at different speeds).
    MPI.COMM_WORLD.Split(int(late)).Barrier()
    if OP == "init":
        if late:
            misbehave()
        try:
            make_comm()
        except nncomm.CommunicatorError as e:
            say(f"rank {MPI.COMM_WORLD.rank}: CommunicatorError: {e}")
            raise
        return
    ck = Checker("waits")
    comm, _ = make_comm()
    if MODE == "exit" and late:
        if OP == "barrier":
            MPI.Finalize()  # as many mpi4py scripts end
        sys.exit(3 if OP == "callback" else 0)
    sent = sigint_soon() if MODE == "interrupt" and comm.rank == 0 else None
    try:
        if MODE == "finish":
            # Once in time: the late call is then not compared again.
            run_op(comm, False)
        result = run_op(comm, late)
    except BaseException as e:
        # Raised in a hook, nnabla hands it on inside SystemErrors.
        chain = exception_chain(e)
        if sent and "KeyboardInterrupt" in chain:
            say(f"rank {comm.rank}: KeyboardInterrupt "
                  f"{time.monotonic() - sent[0]:.2f} s after SIGINT")
            try:
                comm.all_reduce(nd(np.ones(2, np.float32)))
            except nncomm.CommunicatorError as later:
                say(f"rank {comm.rank}: then CommunicatorError: {later}")
        else:
            say(f"rank {comm.rank}: {chain}")
        raise
    if MODE == "finish":
        right = result is None or np.array_equal(result[0].data, result[1])
        print(f"rank {comm.rank}: finished, {'right' if right else 'WRONG'}",
              flush=True)
        return
    if result is not None:
        ck.array(*result, f"{OP} after a late rank")
    ck.finish()


main()
