"""The quantized all-reduce (CNTK's 1-bit SGD and its N-bit variant) on 1
to 4 ranks, bit for bit against tests/mpi/quantize_reference.py.

- QuantizedReducer: every rank's gradients are a known function of its
  world rank and the step, so each rank quantizes every rank's itself
  (residuals carried over 3 steps), decodes and sums them in group order;
  1, 2, 3, 4 and 8 bits, sum and mean, error feedback on and off, on the
  world and the standard sub-groups (one reversed, so that group order is
  not world order). Each rank's residuals are checked too.
- DistributedSolver and data_parallel_solver with quantized compression:
  a 6-9-8-2 tanh MLP trained 4 steps, each rank on its slice of a global
  batch, against an in-process reference that computes every rank's
  gradients on the same model, quantizes and sums them as above and steps
  the same solver: parameters equal bit for bit after every step (op
  average and sum, Momentum and Adam, two passes per step, a sub-group,
  and the warm start, whose local steps are checked against this rank
  training alone and whose averaged model the reference then takes over).
- Misuse raising on every rank, never a hang: bits out of range, ranks
  passing other bits, shapes or gradients, a gradient that stops being
  float, a backward that raises on one rank; groups and a predivide factor
  refused with quantization.
"""
import numpy as np

import nnabla as nn
import nnabla.solvers as S

import nncomm
import quantize_reference as ref
from _harness import mlp, placed, start, world_gather

SHAPES = [(1, 7), (9,), (13, 1), (37, 5), (33, 20), (3, 2, 5), ()]
STEPS = 3
BATCH = 24
SOLVER_STEPS = 4


def gradients(world_rank, step, shapes=SHAPES):
    rng = np.random.default_rng(1000 * step + world_rank)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def same_bits(ck, got, expected, what):
    got = np.asarray(got, np.float32)
    expected = np.asarray(expected, np.float32)
    if got.shape != expected.shape:
        return ck.true(False, what, f"shape {got.shape}, expected "
                                    f"{expected.shape}")
    differ = got.view(np.uint32) != expected.view(np.uint32)
    return ck.true(not differ.any(), what,
                   f"{np.count_nonzero(differ)} of {differ.size} differ, by "
                   f"up to {np.max(np.abs(got - expected), initial=0):.3g}")


def reducer_against_numpy(ck, comm, group, ranks, bits, feedback, division):
    what = f"{group} bits={bits} feedback={feedback} division={division}"
    grads = [nn.NdArray.from_numpy_array(g) for g in gradients(comm.rank, 0)]
    reducer = nncomm.QuantizedReducer(comm, grads, bits, feedback, division,
                                      group=group)
    residuals = {r: [np.zeros(s, np.float32) for s in SHAPES] if feedback
                 else None for r in ranks}
    for step in range(STEPS):
        for x, g in zip(grads, gradients(comm.rank, step)):
            x.data[...] = g
        reducer.reduce()
        values = []
        for r in ranks:
            _, residuals[r], decoded = ref.encode(gradients(r, step),
                                                  residuals[r], bits)
            values.append(decoded)
        for k, (x, e) in enumerate(zip(grads, ref.decode_sum(values,
                                                             division))):
            same_bits(ck, x.data, e, f"{what} step {step} gradient {k}")
        if feedback:
            for k, (x, e) in enumerate(zip(reducer.residuals,
                                           residuals[comm.rank])):
                same_bits(ck, x.data, e, f"{what} step {step} residual {k}")
        else:
            ck.equal(reducer.residuals, None, f"{what}: no residuals")


# -- DistributedSolver --------------------------------------------------------

def batch(step):
    rng = np.random.default_rng(200 + step)
    return (rng.standard_normal((BATCH, 6)).astype(np.float32),
            rng.standard_normal((BATCH, 2)).astype(np.float32))


def passes_over(x, t, loss, solver, xs, ts, member, shard, passes, step):
    """`passes` backward passes of group rank `member` (its slice of the
    batch), with `step(loss)` running each."""
    for p in range(passes):
        rows = slice((member * passes + p) * shard,
                     (member * passes + p + 1) * shard)
        x.d, t.d = xs[rows], ts[rows]
        loss.forward()
        step(loss)


class Reference:
    """The ranks' training in one process: every group rank's gradients on
    one model, quantized with that rank's residuals, decoded and summed;
    one solver steps on the sum."""

    def __init__(self, make_solver, params, shard, bits, op, passes):
        self.x, self.t, self.loss, self.params = mlp("ref", shard, 0)
        self.copy_from(params)
        self.solver = make_solver()
        self.solver.set_parameters(self.params)
        self.shard, self.bits, self.op, self.passes = shard, bits, op, passes
        self.residuals = {}

    def copy_from(self, params):
        for name, v in params.items():
            self.params[name].d = v.d

    def gradients(self, xs, ts, member):
        self.solver.zero_grad()
        passes_over(self.x, self.t, self.loss, self.solver, xs, ts, member,
                    self.shard, self.passes,
                    lambda loss: loss.backward(clear_buffer=True))
        return [v.g.copy() for v in self.params.values()]

    def step(self, xs, ts, size):
        values = []
        for member in range(size):
            grads = self.gradients(xs, ts, member)
            residual = self.residuals.get(
                member, [np.zeros_like(g) for g in grads])
            _, self.residuals[member], decoded = ref.encode(grads, residual,
                                                            self.bits)
            values.append(decoded)
        for v, g in zip(self.params.values(),
                        ref.decode_sum(values, self.op == "average")):
            v.g = g
        self.solver.update()

    def alone(self, xs, ts, member):
        """A warm-start step: this rank's own gradients, unquantized."""
        self.gradients(xs, ts, member)
        self.solver.update()


def solver_case(ck, comm, what, make_solver, bits=1, op="average", passes=1,
                group="world", warm_steps=0, factory=False):
    if placed(comm, group) is None:
        return
    size, member = placed(comm, group)
    nn.clear_parameters()
    shard = BATCH // size // passes
    x, t, loss, params = mlp("dist", shard, comm.rank)
    after = warm_steps * shard * passes
    if factory:
        solver = nncomm.data_parallel_solver(
            make_solver(), comm, num_quantization_bits=bits,
            distributed_after=after)
    else:
        solver = nncomm.DistributedSolver(
            make_solver(), comm,
            compression=nncomm.Compression.quantized(bits), op=op,
            backward_passes_per_step=passes, group=group,
            distributed_after=after)
    solver.set_parameters(params)
    reference = Reference(make_solver, params, shard, bits, op, passes)
    for step in range(SOLVER_STEPS):
        xs, ts = batch(step)
        solver.zero_grad()
        passes_over(x, t, loss, solver, xs, ts, member, shard, passes,
                    lambda loss: solver.backward(loss, clear_buffer=True))
        solver.update()
        if step + 1 == warm_steps:
            reference.alone(xs, ts, member)
            check_averaged(ck, comm, what, params, reference)
            take_over(reference, params, solver)
            continue
        if step < warm_steps:
            reference.alone(xs, ts, member)
        else:
            reference.step(xs, ts, size)
        for name, v in params.items():
            same_bits(ck, v.d, reference.params[name].d,
                      f"{what}: step {step} {name}")


def check_averaged(ck, comm, what, params, reference):
    """Where the warm start ends, the ranks' parameters are the mean of
    the models each trained alone (the reference's, here; every rank of
    the world is in the group)."""
    names = sorted(params)
    everyone = world_gather([reference.params[name].d for name in names])
    for i, name in enumerate(names):
        mean = np.mean([e[i] for e in everyone], axis=0)
        ck.true(np.allclose(params[name].d, mean, rtol=1e-6, atol=1e-7),
                f"{what}: {name} averaged where the warm start ends")


def take_over(reference, params, solver):
    """The reference goes on from the ranks' averaged model: parameters
    and solver states copied, not shared."""
    reference.copy_from(params)
    states = reference.solver.get_states()
    averaged = solver.get_states()
    for name, state in states.items():
        state.t = averaged[name].t
        for key, v in state.pstate.items():
            v.d = averaged[name].pstate[key].d
    reference.solver.set_states(states)


# -- misuse -------------------------------------------------------------------

def misuse(ck, comm):
    last = comm.rank == comm.size - 1
    others = comm.size > 1
    grads = [nn.NdArray.from_numpy_array(g) for g in gradients(0, 0)]
    for bits in (0, 9, 1.0, True, "1"):
        ck.raises(ValueError, "1 to 8", f"quantized({bits!r})",
                  nncomm.Compression.quantized, bits)
    for bits in (0, 16, 31, 33, 1.0):
        ck.raises(ValueError, "unless 32", f"num_quantization_bits={bits}",
                  nncomm.data_parallel_solver, S.Sgd(0.1), comm, bits)
    ck.equal(repr(nncomm.Compression.quantized(2, error_feedback=False)),
             "nncomm.Compression.quantized(2, error_feedback=False)", "repr")
    quantized = nncomm.Compression.quantized(1)
    ck.raises(ValueError, "groups", "groups with quantization",
              nncomm.DistributedSolver, S.Sgd(0.1), comm,
              compression=quantized, groups=2)
    ck.raises(ValueError, "does not apply", "predivide with quantization",
              nncomm.DistributedSolver, S.Sgd(0.1), comm,
              compression=quantized, gradient_predivide_factor=2.0)
    ck.raises(ValueError, "needs op='average'", "predivide with sum",
              nncomm.DistributedSolver, S.Sgd(0.1), comm,
              compression=quantized, op="sum", gradient_predivide_factor=2.0)
    ck.raises(ValueError, "1 to 8", "bits 9 on every rank",
              nncomm.QuantizedReducer, comm, grads, 9)
    # The last rank passes other arguments: where they are bad, it raises
    # its own error and the others ValueError; where they only differ,
    # every rank raises ValueError (one rank alone agrees with itself).
    ints = [nn.NdArray.from_numpy_array(np.zeros(3, np.int32))]
    for what, data, bits, own in [
            ("other bits", grads, 2, None),
            ("fewer gradients", grads[:-1], 1, None),
            ("bits out of range", grads, 9, (ValueError, "1 to 8")),
            ("an int gradient", ints, 1, (TypeError, "must be float"))]:
        if not last:
            data, bits = grads, 1
        what = f"{what} on the last rank"
        if own and last:
            ck.raises(*own, what, nncomm.QuantizedReducer, comm, data, bits)
        elif own:
            ck.raises(ValueError, "passed invalid arguments", what,
                      nncomm.QuantizedReducer, comm, data, bits)
        elif others:
            ck.raises(ValueError, "pass different gradients", what,
                      nncomm.QuantizedReducer, comm, data, bits)
        else:
            nncomm.QuantizedReducer(comm, data, bits)
    became_int(ck, comm, last)
    backward_raises(ck, comm, last)


def became_int(ck, comm, last):
    grads = [nn.NdArray.from_numpy_array(g) for g in gradients(0, 0)]
    before = [np.array(x.data) for x in grads]
    reducer = nncomm.QuantizedReducer(comm, grads, 1)
    if last:
        grads[2].cast(np.int32)
        ck.raises(TypeError, "became int32", "gradient became int here",
                  reducer.reduce)
        grads[2].cast(np.float32)
    else:
        ck.raises(RuntimeError, "failed", "another rank's gradient became "
                  "int", reducer.reduce)
        for k, (x, b) in enumerate(zip(grads, before)):
            same_bits(ck, x.data, b, f"gradient {k} untouched by a failed "
                      f"step")
    reducer.reduce()
    everyone = world_gather([x.data for x in grads])
    ck.true(all(np.array_equal(e[k], everyone[0][k]) for e in everyone
                for k in range(len(grads))),
            "the step after a failed one reduces alike everywhere")


def backward_raises(ck, comm, last):
    nn.clear_parameters()
    x, t, loss, params = mlp("raises", 4, 1)
    x.d, t.d = np.ones(x.shape), np.zeros(t.shape)
    solver = nncomm.DistributedSolver(
        S.Sgd(0.1), comm, compression=nncomm.Compression.quantized(2))
    solver.set_parameters(params)
    loss.forward()
    solver.zero_grad()
    if last:
        # nnabla's backward refuses the keyword before it starts.
        ck.raises(TypeError, "no_such_option", "backward raising here",
                  solver.backward, loss, no_such_option=1)
    else:
        ck.raises(RuntimeError, "failed", "backward raising on another rank",
                  solver.backward, loss)
    ck.raises(RuntimeError, "not all-reduced", "no update after it",
              solver.update)
    solver.zero_grad()
    solver.backward(loss)
    solver.update()
    everyone = world_gather([v.d for v in params.values()])
    ck.true(all(np.array_equal(e[k], everyone[0][k]) for e in everyone
                for k in range(len(params))),
            "a step after the failed one keeps the ranks in step")


def main():
    ck, comm, groups = start("quantized")
    for group, ranks in groups:
        settings = [(1, True, True), (2, False, False), (4, True, False),
                    (8, True, True)] if group == "world" else \
            [(1, True, False), (3, True, True)]
        for bits, feedback, division in settings:
            reducer_against_numpy(ck, comm, group, ranks, bits, feedback,
                                  division)
    solver_case(ck, comm, "1 bit, Momentum", lambda: S.Momentum(0.1, 0.9))
    solver_case(ck, comm, "2 bits, sum, Adam", lambda: S.Adam(0.01), bits=2,
                op="sum")
    solver_case(ck, comm, "4 bits, 2 passes", lambda: S.Momentum(0.1, 0.9),
                bits=4, passes=2)
    solver_case(ck, comm, "data_parallel_solver, 1 bit",
                lambda: S.Momentum(0.1, 0.9), factory=True)
    solver_case(ck, comm, "data_parallel_solver, 1 bit, 2 steps alone",
                lambda: S.Momentum(0.1, 0.9), warm_steps=2, factory=True)
    if comm.size >= 2:
        comm.new_group(("pair", [comm.size - 1, 0]))
        solver_case(ck, comm, "1 bit on a pair", lambda: S.Sgd(0.1),
                    group="pair")
    misuse(ck, comm)
    ck.finish()


main()
