"""``nncomm-run`` (also ``python -m nncomm.run``): starts a Python script on
N ranks, with nncomm's settings on every rank.

    nncomm-run -np 4 -H node1:2,node2:2 --timeout 600 train.py --epochs 10

The ranks run under the ``mpiexec`` of the environment nncomm is installed
in (the ``mpich`` wheel's, beside the interpreter; ``NNCOMM_MPIEXEC`` names
another), or under ``srun`` inside a Slurm allocation, each with this
environment's interpreter. The launcher builds that command and replaces
itself with it, so the job's exit status is the launcher's and Ctrl-C or
SIGTERM go straight to mpiexec (or srun), which passes them on to every
rank. See "Launching" in docs/api.md.
"""
import argparse
import math
import os
import re
import shutil
import sys

PROG = "nncomm-run"

# Launches that never start exit as argparse does on a usage error.
USAGE_ERROR = 2

# option (its argparse dest) -> the NNCOMM_* variable it sets on each rank
SETTINGS = {"timeline": "NNCOMM_TIMELINE",
            "stall_warning": "NNCOMM_STALL_WARNING",
            "timeout": "NNCOMM_TIMEOUT",
            "nnabla": "NNCOMM_NNABLA"}

# One entry of -H: hydra's "host" or "host:slots".
HOST = re.compile(r"[^\s:,]+(:[1-9][0-9]*)?")


class LaunchError(Exception):
    """A launch that cannot start; the message says why, on one line."""


def positive_int(text):
    """-np's value: a number of ranks."""
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(
            f"expected a positive number of ranks, got {text!r}")
    return count


def seconds(text):
    """A time limit as the ranks read it: seconds, 0 for none, at most
    1e9 (src/observability/config.cpp); returned in a form C's strtod
    parses whole."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1e9:
        raise argparse.ArgumentTypeError(
            f"expected seconds from 0 (none) to 1e9, got {text!r}")
    return repr(value)


def host_list(text):
    """-H's value, checked: host[:slots] entries separated by commas, as
    hydra's -hosts takes them."""
    bad = [h for h in text.split(",") if not HOST.fullmatch(h)]
    if bad:
        raise argparse.ArgumentTypeError(
            f"expected host[:slots],..., slots a positive number; "
            f"got {bad[0]!r}")
    return text


def trace_path(text):
    """--timeline's value, made absolute so that a rank that changes its
    working directory still writes where the user meant."""
    if not text:
        raise argparse.ArgumentTypeError("expected a path, got ''")
    return os.path.abspath(text)


def parse_args(argv=None):
    """The launcher's command line; `argv` without the program name."""
    parser = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,
        usage=f"{PROG} -np N [options] script.py [args ...]\n"
              f"       {PROG} -np N [options] -m module [args ...]",
        description="Runs a Python script on N ranks under mpiexec (srun "
                    "inside a Slurm allocation).")
    parser.add_argument("-np", "-n", "--num-proc", dest="np", metavar="N",
                        type=positive_int, required=True,
                        help="number of ranks")
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", type=host_list,
                       metavar="HOST:SLOTS,...",
                       help="hosts and how many ranks each takes "
                            "(default: all on this host)")
    hosts.add_argument("--hostfile", metavar="FILE",
                       help="hydra's host file: one host[:slots] a line")
    parser.add_argument("--timeline", type=trace_path, metavar="PATH",
                        help="sets NNCOMM_TIMELINE on every rank")
    parser.add_argument("--stall-warning", type=seconds, metavar="S",
                        help="sets NNCOMM_STALL_WARNING on every rank")
    parser.add_argument("--timeout", type=seconds, metavar="S",
                        help="sets NNCOMM_TIMEOUT on every rank")
    parser.add_argument("--nnabla", choices=("auto", "nncomm", "off"),
                        help="sets NNCOMM_NNABLA on every rank: whether "
                             "nnabla's communicator factories answer with "
                             "nncomm's communicator where nnabla has none "
                             "(auto, the default), always (nncomm), or "
                             "never (off)")
    parser.add_argument("-m", "--module", action="store_true",
                        help="run the module named in place of the script, "
                             "as python -m does")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # A leading "--" only ends the launcher's options.
    if args.command[:1] == ["--"]:
        del args.command[0]
    if not args.command:
        parser.error("no script given" if not args.module
                     else "no module given")
    return args


def rank_command(args):
    """What every rank runs: ``python -m nncomm``, which answers nnabla's
    communicator factories with nncomm's (nncomm.nnabla_adapter.entry),
    then runs the script through mpi4py's runner: a rank whose script raises then
    calls MPI_Abort, and mpiexec (or srun) ends every rank; run as plain
    ``python script.py``, the other ranks would wait in their next
    collective until NNCOMM_TIMEOUT (30 minutes by default).
    """
    program, *script_args = args.command
    if not args.module and not os.path.isfile(program):
        raise LaunchError(f"no such script: {program}")
    return [sys.executable, "-m", "nncomm",
            *(["-m"] if args.module else []), program, *script_args]


def rank_settings(args):
    """The NNCOMM_* variables the options set: {name: value}."""
    return {name: getattr(args, dest) for dest, name in SETTINGS.items()
            if getattr(args, dest) is not None}


def slurm_command(args, srun, environ):
    """srun's command and environment for `args`."""
    if args.hosts or args.hostfile:
        raise LaunchError("-H and --hostfile do not apply under Slurm: "
                          "the allocation gives the hosts")
    # --mpi=pmi2: Slurm's PMI-2 server also speaks the PMI-1 wire protocol
    # of the mpich wheel, whose ranks would otherwise each start alone.
    # --kill-on-bad-exit: a rank that exits non-zero ends the others, as
    # mpiexec does. srun has no option per variable: the settings go in
    # its environment, which --export=ALL carries to every task even
    # where the batch script was submitted with --export=NONE.
    command = [srun, "-n", str(args.np), "--mpi=pmi2",
               "--kill-on-bad-exit=1", "--export=ALL", *rank_command(args)]
    return command, {**environ, **rank_settings(args)}


def mpiexec_command(args, environ):
    """mpiexec's (hydra's) command and environment for `args`."""
    mpiexec = environ.get("NNCOMM_MPIEXEC") or \
        os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.access(mpiexec, os.X_OK):
        raise LaunchError(
            f"no mpiexec at {mpiexec}: install the 'mpich' wheel into this "
            f"environment (pip install mpich) or name one in NNCOMM_MPIEXEC")
    if args.hostfile is not None and not os.path.isfile(args.hostfile):
        raise LaunchError(f"no such host file: {args.hostfile}")
    hosts = ["-hosts", args.hosts] if args.hosts else \
        ["-f", args.hostfile] if args.hostfile else []
    # -genv: hydra sets each on every rank, on remote hosts too.
    settings = [word for name, value in rank_settings(args).items()
                for word in ("-genv", name, value)]
    return [mpiexec, *hosts, *settings, "-n", str(args.np),
            *rank_command(args)], environ


def launch_command(args, environ):
    """The command that starts the job, and its environment: srun's where
    `environ` is inside a Slurm allocation with srun on its PATH, else
    mpiexec's.

    Raises:
        LaunchError: the job cannot start (no script, no mpiexec, hosts
            given under Slurm, no host file).
    """
    srun = shutil.which("srun", path=environ.get("PATH")) \
        if environ.get("SLURM_JOB_ID") else None
    if srun is not None:
        return slurm_command(args, srun, environ)
    return mpiexec_command(args, environ)


def main(argv=None):
    """nncomm-run's entry point: becomes the job, or returns 2 (after a
    one-line message on stderr) where it cannot start.

    Args:
        argv (list of str): the command line without the program name;
            default ``sys.argv[1:]``.

    Example:

    .. code-block:: python

        from nncomm.run import main
        main(["-np", "2", "--timeout", "600", "train.py"])  # never returns
    """
    args = parse_args(argv)
    try:
        command, env = launch_command(args, os.environ)
    except LaunchError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    os.execve(command[0], command, env)


if __name__ == "__main__":
    sys.exit(main())
