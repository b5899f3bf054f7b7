"""The element space of DistributedSolver(shard="state"), without MPI:
every rank's range, and the parameter slices a range covers, for every
small layout (parameters of 0 to 4 elements, 1 to 5 ranks)."""
import itertools

from nncomm.sharded_state import element_ranges, pieces


def test_ranges_partition_the_elements_evenly():
    for total, ranks in itertools.product(range(12), range(1, 6)):
        ranges = element_ranges(total, ranks)
        assert len(ranges) == ranks
        assert ranges[0][0] == 0 and ranges[-1][1] == total
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        lengths = [b - a for a, b in ranges]
        assert max(lengths) - min(lengths) <= 1


def test_pieces_are_the_parameters_elements_in_the_range():
    for sizes in itertools.product(range(5), repeat=3):
        owner = [(i, k) for i, size in enumerate(sizes) for k in range(size)]
        for ranks in range(1, 6):
            for start, stop in element_ranges(len(owner), ranks):
                found = [(i, k) for i, a, b in pieces(sizes, start, stop)
                         for k in range(a, b)]
                assert found == owner[start:stop]
                assert all(a < b for _, a, b in pieces(sizes, start, stop))


def test_three_ranks_of_the_test_mlp_straddle_parameters():
    # tests/mpi/sharded_state.py's 6-9-8-2 MLP, parameters W, b per layer.
    sizes = [54, 9, 72, 8, 16, 2]
    assert element_ranges(161, 3) == [(0, 53), (53, 107), (107, 161)]
    assert pieces(sizes, 53, 107) == [(0, 53, 54), (1, 0, 9), (2, 0, 44)]
