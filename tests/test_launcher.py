"""nncomm-run starts a script on N ranks with the settings its options name
on every rank, becomes the job (its exit status, its signals), goes
through srun inside a Slurm allocation, and refuses bad command lines with
exit status 2 and one line saying why."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from launcher import WORKERS, run_command

LAUNCHED = os.path.join(WORKERS, "launched.py")

# The launcher as `python -m nncomm.run`, and as the console script that
# pip makes of setup.py's entry point calls it.
STARTS = {
    "module": [sys.executable, "-m", "nncomm.run"],
    "entry": [sys.executable, "-c",
              "import sys; from nncomm.run import main; sys.exit(main())"],
}


def launcher_env(env=None):
    """This environment without NNCOMM_* (only the launcher sets them),
    with `env` added."""
    full = {k: v for k, v in os.environ.items()
            if not k.startswith("NNCOMM_")}
    full.update(env or {})
    return full


def launch(args, start="module", env=None):
    """Runs nncomm-run with `args`; returns (exit code, stdout, stderr)."""
    code, out, err, _ = run_command(
        [*STARTS[start], *map(str, args)], launcher_env(env), 60)
    return code, out, err


def reports(settings="", args=()):
    """launched.py report's lines on 2 ranks."""
    return [f"rank {r} of 2: sum 1; {settings}; args {list(args)}"
            for r in (0, 1)]


@pytest.mark.parametrize("start", sorted(STARTS))
def test_settings_reach_every_rank(start):
    code, out, err = launch(
        ["-np", "2", "--timeline", "trace.json", "--stall-warning", "5",
         "--timeout", "1e3", "--nnabla", "nncomm", LAUNCHED, "report", "-np",
         "3"], start=start)
    assert code == 0, out + err
    # The relative path is the launcher's, made absolute; the script's own
    # "-np 3" is left to it.
    settings = (f"NNCOMM_NNABLA=nncomm NNCOMM_STALL_WARNING=5.0 "
                f"NNCOMM_TIMELINE={os.path.abspath('trace.json')} "
                f"NNCOMM_TIMEOUT=1000.0")
    assert sorted(out.splitlines()) == reports(settings, ["-np", "3"])


@pytest.mark.parametrize("option", ["-H", "--hostfile"])
def test_hosts(option, tmp_path):
    hosts = "localhost:2"
    if option == "--hostfile":
        hosts = tmp_path / "hosts"
        hosts.write_text("localhost:2\n")
    code, out, err = launch(["-np", "2", option, hosts, LAUNCHED, "report"])
    assert code == 0, out + err
    assert sorted(out.splitlines()) == reports()


def test_module():
    code, out, err = launch(
        ["-np", "2", "-m", "launched", "report", "x"],
        env={"PYTHONPATH": os.pathsep.join(
            [WORKERS, os.environ.get("PYTHONPATH", "")])})
    assert code == 0, out + err
    assert sorted(out.splitlines()) == reports(args=["x"])


def test_exit_status_is_the_jobs():
    code, out, err = launch(["-np", "2", LAUNCHED, "exit", "3"])
    assert code == 3, out + err


def test_a_raising_rank_ends_the_job():
    # Rank 0 waits in a barrier rank 1 never reaches: only the abort that
    # mpi4py's runner makes ends it (else launch() fails on its timeout).
    code, out, err = launch(["-np", "2", LAUNCHED, "raise"])
    assert code != 0
    assert "RuntimeError: rank 1 fails" in err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_reaches_every_rank(signum, tmp_path):
    proc = subprocess.Popen(
        [*STARTS["module"], "-np", "2", LAUNCHED, "wait", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=launcher_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("ready.*"))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, \
                proc.communicate()
            time.sleep(0.1)
        # The launcher has become mpiexec: nothing stands between the
        # signal and the process that forwards it.
        exe = os.path.basename(os.readlink(f"/proc/{proc.pid}/exe"))
        assert exe.startswith("mpiexec")
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0, out + err
    got = [(tmp_path / f"got.{r}").read_text() for r in (0, 1)]
    assert got == [signum.name] * 2, out + err


@pytest.fixture
def slurm(tmp_path):
    """A Slurm allocation whose srun records its command line and NNCOMM_*
    environment in tmp_path/srun.json, then exits 7; yields (environment,
    srun's path)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(
        f"#!{sys.executable}\n"
        f"import json, os, sys\n"
        f"env = {{k: v for k, v in os.environ.items() "
        f"if k.startswith('NNCOMM_')}}\n"
        f"with open({str(tmp_path / 'srun.json')!r}, 'w') as f:\n"
        f"    json.dump({{'argv': sys.argv, 'env': env}}, f)\n"
        f"sys.exit(7)\n")
    srun.chmod(0o755)
    yield {"SLURM_JOB_ID": "42",
           "PATH": os.pathsep.join([str(bin_dir), os.environ["PATH"]])}, srun


def test_slurm_runs_srun(slurm, tmp_path):
    env, srun = slurm
    code, out, err = launch(["-np", "3", "--timeout", "60", LAUNCHED,
                             "report", "x"], env=env)
    assert code == 7, out + err
    with open(tmp_path / "srun.json") as f:
        recorded = json.load(f)
    assert recorded["argv"] == [
        str(srun), "-n", "3", "--mpi=pmi2", "--kill-on-bad-exit=1",
        "--export=ALL", sys.executable, "-m", "nncomm", LAUNCHED, "report",
        "x"]
    assert recorded["env"] == {"NNCOMM_TIMEOUT": "60.0"}


def test_slurm_refuses_hosts(slurm):
    env, _ = slurm
    code, out, err = launch(["-np", "2", "-H", "node1:2", LAUNCHED], env=env)
    assert code == 2 and out == ""
    assert err.splitlines() == [
        "nncomm-run: error: -H and --hostfile do not apply under Slurm: "
        "the allocation gives the hosts"]


SECONDS = "expected seconds from 0 (none) to 1e9"
NP = "argument -np/-n/--num-proc: expected a positive number of ranks"


@pytest.mark.parametrize("args,env,message", [
    (["missing.py"], {}, "no such script: missing.py"),
    ([LAUNCHED], {"NNCOMM_MPIEXEC": "/nonexistent/mpiexec"},
     "no mpiexec at /nonexistent/mpiexec: install the 'mpich' wheel into "
     "this environment (pip install mpich) or name one in NNCOMM_MPIEXEC"),
    (["-H", "localhost:2", "--hostfile", "hosts", LAUNCHED], {},
     "argument --hostfile: not allowed with argument -H/--hosts"),
    (["-H", "node1:2,node2:0", LAUNCHED], {},
     "argument -H/--hosts: expected host[:slots],..., slots a positive "
     "number; got 'node2:0'"),
    (["--hostfile", "missing-hosts", LAUNCHED], {},
     "no such host file: missing-hosts"),
    (["--timeout", "-1", LAUNCHED], {},
     f"argument --timeout: {SECONDS}, got '-1'"),
    (["--timeout", "soon", LAUNCHED], {},
     f"argument --timeout: {SECONDS}, got 'soon'"),
    (["--stall-warning", "inf", LAUNCHED], {},
     f"argument --stall-warning: {SECONDS}, got 'inf'"),
    (["--timeline", "", LAUNCHED], {},
     "argument --timeline: expected a path, got ''"),
    (["--nnabla", "on", LAUNCHED], {},
     "argument --nnabla: invalid choice: 'on' (choose from 'auto', "
     "'nncomm', 'off')"),
    ([], {}, "no script given"),
    (["-m"], {}, "no module given"),
], ids=["missing script", "no mpiexec", "-H and --hostfile", "bad -H",
        "no hostfile", "negative timeout", "timeout not a number",
        "infinite stall warning", "empty timeline", "unknown --nnabla",
        "no script given",
        "no module given"])
def test_bad_launch_exits_2(args, env, message):
    code, out, err = launch(["-np", "2", *args], env=env)
    assert code == 2 and out == ""
    # argparse's errors come after its usage line.
    assert err.splitlines()[-1] == f"nncomm-run: error: {message}"


@pytest.mark.parametrize("flag", ["-np", "-n"])
@pytest.mark.parametrize("count", ["0", "two", "-1"])
def test_bad_rank_count_exits_2(flag, count):
    code, out, err = launch([flag, count, LAUNCHED])
    assert code == 2 and out == ""
    assert err.splitlines()[-1] == \
        f"nncomm-run: error: {NP}, got '{count}'"
