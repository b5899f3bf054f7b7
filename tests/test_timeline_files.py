"""nncomm.timeline's files, without MPI: parts merged into one JSON file
(complete or cut short, as a rank that died leaves them), loaded, merged
by rank 0 (complete parts removed, the others kept and named), and the
command line ``python -m nncomm.timeline merge``. The files the ranks
write are tested by the MPI worker tests/mpi/timeline.py."""
import json
import os

import pytest

from nncomm import timeline

METADATA = ('{"name":"process_name","ph":"M","ts":0,"pid":%d,"tid":0,'
            '"args":{"name":"rank %d"}},\n')
EVENT = ('{"name":"%s","cat":"engine","ph":"X","ts":1.5,"dur":2.0,'
         '"pid":%d,"tid":3,"args":{"bucket":0}},\n')
STOPPED = ('{"name":"timeline stopped","cat":"timeline","ph":"i","s":"p",'
           '"ts":9.0,"pid":%d,"tid":0,"args":{"dropped_events":0}}\n]\n')


def write_part(path, rank, names, complete):
    """A part as rank `rank` writes it; without `complete`, cut short in
    the middle of an event, as a rank that died leaves it."""
    text = "[\n" + METADATA % (rank, rank) + \
        "".join(EVENT % (n, rank) for n in names)
    text += STOPPED % rank if complete else '{"name":"half","ph":"X","t'
    with open(path, "w") as f:
        f.write(text)
    return str(path)


def test_parts_whole_and_cut_short_merge_into_one_json_file(tmp_path):
    whole = write_part(tmp_path / "t.rank0", 0, ["pack", "reduce"], True)
    cut = write_part(tmp_path / "t.rank1", 1, ["pack"], False)
    assert timeline.is_complete(whole) and not timeline.is_complete(cut)
    out = str(tmp_path / "t.json")
    merged = timeline.merge(out, [whole, cut])
    assert merged == timeline.Merged(6, [cut])
    with open(out) as f:
        events = json.load(f)      # the merged file is complete JSON
    assert [(e["pid"], e["name"]) for e in events] == [
        (0, "process_name"), (0, "pack"), (0, "reduce"),
        (0, "timeline stopped"), (1, "process_name"), (1, "pack")]
    assert timeline.load(cut) == [e for e in events if e["pid"] == 1]
    assert sorted(os.listdir(tmp_path)) == ["t.json", "t.rank0", "t.rank1"]


def test_rank_0_removes_the_parts_only_once_all_were_merged(tmp_path):
    path = str(tmp_path / "t.json")
    write_part(timeline.part_path(path, 0), 0, ["pack"], True)
    write_part(timeline.part_path(path, 1), 1, ["pack"], False)
    with pytest.warns(RuntimeWarning,
                      match=r"missing \[.*t\.json\.rank2'\].*"
                            r"incomplete \[.*t\.json\.rank1'\]"):
        merged = timeline.merge_parts(path, 3, wait_seconds=0.2)
    assert merged.events == 5
    assert sorted(os.listdir(tmp_path)) == ["t.json", "t.json.rank0",
                                            "t.json.rank1"]
    write_part(timeline.part_path(path, 1), 1, ["pack"], True)
    write_part(timeline.part_path(path, 2), 2, ["pack"], True)
    assert timeline.merge_parts(path, 3).events == 9
    assert os.listdir(tmp_path) == ["t.json"]


def test_command_line_merges_and_reports_incomplete_parts(tmp_path, capsys):
    whole = write_part(tmp_path / "a", 0, ["pack"], True)
    cut = write_part(tmp_path / "b", 1, ["unpack"], False)
    out = str(tmp_path / "merged.json")
    assert timeline.main(["merge", out, whole, cut]) == 0
    printed = capsys.readouterr().out
    assert "5 events from 2 parts" in printed
    assert f"{cut} was incomplete" in printed
    assert {e["name"] for e in timeline.load(out)} == {
        "process_name", "pack", "unpack", "timeline stopped"}
    with pytest.raises(SystemExit):
        timeline.main(["merge", out, str(tmp_path / "missing")])
    assert "no such file" in capsys.readouterr().err
