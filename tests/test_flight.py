"""python -m nncomm.flight on synthetic flight records, in one process: the
first operation not every rank completed, and whom it blames (a rank that
never reached it, one that made another call there, one that left no
record); rings that lost their oldest operations; several groups; files
that another job left in the directory; the files it reads and
refuses."""
import json

import pytest

from nncomm import flight

ALL_REDUCE = ("allreduce", "all_reduce of 1 arrays", "00000000000000aa")
BCAST = ("bcast", "bcast of 1 arrays from group rank 0", "00000000000000bb")


def record(seq, call=ALL_REDUCE, state="completed", t=None):
    op, label, fingerprint = call
    return {"seq": seq, "op": op, "call": label, "phase": "operation",
            "count": 5, "bytes": 20, "dtype": "float32", "root": 0,
            "fingerprint": fingerprint, "state": state,
            "enqueued": float(seq if t is None else t), "ended": None,
            "site": f"train.py:{10 + seq} in step"}


def ring(world_ranks, records, channel=0):
    return {"world_ranks": world_ranks, "channel": channel,
            "last_seq": max((r["seq"] for r in records), default=0),
            "records": records}


def dump(rank, size, *rings):
    return {"nncomm_flight_record": 1, "rank": rank, "world_size": size,
            "host": "h", "pid": 100 + rank, "time": 99.0,
            "reason": "test", "first_reason": None, "entries": 2000,
            "groups": list(rings)}


def completed(n):
    return [record(s) for s in range(1, n + 1)]


def test_every_operation_completed_everywhere():
    dumps = {r: dump(r, 2, ring([0, 1], completed(4))) for r in range(2)}
    analysis = flight.analyze(dumps)
    assert analysis.divergences == [] and flight.culprits(analysis) == []
    assert "no divergence" in flight.report(analysis, dumps)


def test_a_rank_that_never_reached_the_operation():
    waiting = completed(3) + [record(4, state="started")]
    dumps = {0: dump(0, 3, ring([0, 1, 2], waiting)),
             1: dump(1, 3, ring([0, 1, 2], completed(3))),
             2: dump(2, 3, ring([0, 1, 2], waiting))}
    analysis = flight.analyze(dumps)
    d = analysis.divergences[0]
    assert (d.seq, d.waiting, d.not_reached, d.different, d.no_record) == \
        (4, [0, 2], [1], {}, [])
    assert d.expected["site"] == "train.py:14 in step"
    # Where the rank that did not come was last.
    assert d.last[1][2]["seq"] == 3
    assert flight.culprits(analysis) == [1]
    text = flight.report(analysis, dumps)
    assert "world rank 1: never reached it" in text
    assert "rank 1's last operation: operation 3: all_reduce of 1 " \
           "arrays (allreduce, 5 x float32), completed, at train.py:13" in text
    assert text.endswith("diverged first: world rank 1\n")


def test_a_rank_that_made_another_call_there():
    dumps = {r: dump(r, 3, ring([0, 1, 2], completed(2) + [
        record(3, BCAST if r == 2 else ALL_REDUCE, "started")]))
        for r in range(3)}
    analysis = flight.analyze(dumps)
    d = analysis.divergences[0]
    assert d.seq == 3 and d.waiting == [0, 1] and list(d.different) == [2]
    assert d.expected["op"] == "allreduce"
    assert flight.culprits(analysis) == [2]
    assert "made another call there: operation 3: bcast of 1 arrays " \
           "from group rank 0 (bcast" in flight.report(analysis, dumps)


def test_two_ranks_in_different_calls_are_both_named():
    dumps = {r: dump(r, 2, ring([0, 1], completed(1) + [
        record(2, BCAST if r else ALL_REDUCE, "started")]))
        for r in range(2)}
    analysis = flight.analyze(dumps)
    assert analysis.divergences[0].expected is None
    assert flight.culprits(analysis) == [0, 1]


def test_a_rank_without_a_record_is_blamed_where_the_others_wait():
    waiting = completed(5) + [record(6, state="started")]
    dumps = {r: dump(r, 3, ring([0, 1, 2], waiting)) for r in (0, 1)}
    analysis = flight.analyze(dumps)
    assert analysis.missing == [2]
    d = analysis.divergences[0]
    assert (d.seq, d.waiting, d.no_record, d.not_reached) == (6, [0, 1], [2],
                                                              [])
    assert flight.culprits(analysis) == [2]
    assert "world rank 2: no record" in flight.report(analysis, dumps)


def test_operations_gone_from_a_ring_are_no_divergence():
    # Rank 0's ring kept operations 5 to 8 only, rank 1's 3 to 8.
    dumps = {0: dump(0, 2, ring([0, 1], [record(s) for s in range(5, 9)])),
             1: dump(1, 2, ring([0, 1], [record(s) for s in range(3, 8)]
                                + [record(8, state="started")]))}
    d = flight.analyze(dumps).divergences[0]
    assert (d.seq, d.completed, d.waiting, d.not_reached) == (8, [0], [1],
                                                              [])


def test_the_group_where_ranks_diverged_first_comes_first():
    # Rank 2 waits in a subgroup's operation 2 (since t=10) that rank 0
    # never joins; the world's operation 4 (t=20) then lacks rank 2.
    world_waiting = completed(3) + [record(4, state="started", t=20)]
    sub = [record(1, t=1), record(2, state="started", t=10)]
    dumps = {0: dump(0, 3, ring([0, 1, 2], world_waiting),
                     ring([0, 2], sub[:1])),
             1: dump(1, 3, ring([0, 1, 2], world_waiting)),
             2: dump(2, 3, ring([0, 1, 2], completed(3)), ring([0, 2], sub))}
    analysis = flight.analyze(dumps)
    first, then = analysis.divergences
    assert (first.group, first.seq, first.waiting, first.not_reached) == \
        ([0, 2], 2, [2], [0])
    assert (then.group, then.seq, then.not_reached) == ([0, 1, 2], 4, [2])
    # Rank 2's last operation is the one it waits in, in the subgroup.
    assert then.last[2][:2] == ((0, 2), 0) and then.last[2][2]["seq"] == 2
    assert flight.culprits(analysis) == [0]


def test_files_of_another_job_are_left_out(tmp_path):
    # An earlier 3-rank job left ranks 1 and 2's files; this 2-rank job's
    # rank 1 was killed before it wrote one. Rank 1 must be blamed, not
    # rank 0 for missing the old job's operations.
    old = {r: dict(dump(r, 3, ring([0, 1, 2], completed(4))), time=50.0,
                   job="00000000000000a1") for r in (1, 2)}
    now = {0: dict(dump(0, 2, ring([0, 1], completed(2)
                                   + [record(3, state="started")])),
                   job="00000000000000b2")}
    dumps = {**old, **now}
    analysis = flight.analyze(dumps)
    assert (analysis.world_size, analysis.ranks, analysis.other_job,
            analysis.missing) == (2, [0], [1, 2], [1])
    assert flight.culprits(analysis) == [1]
    text = flight.report(analysis, dumps)
    assert "left out: the files of world ranks 1, 2, which another job " \
        "wrote" in text, text
    for r, d in dumps.items():
        (tmp_path / f"nncomm-flight-{r}.json").write_text(json.dumps(d))
    assert flight.culprits(flight.analyze(flight.load(str(tmp_path)))) == [1]


def test_load_reads_every_rank_and_refuses_what_is_not_a_record(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        flight.load(str(tmp_path / "none"))
    with pytest.raises(ValueError, match="holds no nncomm-flight"):
        flight.load(str(tmp_path))
    for r in range(2):
        (tmp_path / f"nncomm-flight-{r}.json").write_text(
            json.dumps(dump(r, 2, ring([0, 1], completed(2)))))
    assert sorted(flight.load(str(tmp_path))) == [0, 1]
    (tmp_path / "nncomm-flight-7.json").write_text("{\"rank\": ")
    with pytest.raises(ValueError, match="nncomm-flight-7.json is not a "
                                         "flight record"):
        flight.load(str(tmp_path))


def test_the_command_prints_the_report(tmp_path, capsys):
    (tmp_path / "nncomm-flight-0.json").write_text(json.dumps(
        dump(0, 2, ring([0, 1], [record(1, state="started")]))))
    assert flight.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no record from world ranks 1" in out
    assert out.endswith("diverged first: world rank 1\n")
    with pytest.raises(SystemExit):
        flight.main([str(tmp_path / "none")])
    assert "no such directory" in capsys.readouterr().err
