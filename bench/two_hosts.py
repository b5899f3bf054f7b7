"""What the benchmarks that run jobs of their own share: a job's results,
and for bench/run_two_hosts.sh's emulated hosts the script's path and the
link's counters."""
import json
import os
import subprocess

TWO_HOSTS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                         "run_two_hosts.sh")


def job_results(cmd, env, timeout, what):
    """Runs the job `cmd` and returns the JSON its rank 0 printed on a line
    starting with ``RESULTS``; RuntimeError with its output if none, naming
    the job `what`."""
    out = subprocess.run(cmd, capture_output=True, text=True, env=env,
                         timeout=timeout)
    for line in out.stdout.splitlines():
        if line.startswith("RESULTS "):
            return json.loads(line[len("RESULTS "):])
    raise RuntimeError(f"{what} failed:\n{out.stdout}\n{out.stderr}")


def link_bytes():
    """Bytes the link between the hosts has carried, both ways."""
    out = subprocess.run([TWO_HOSTS, "--sent"], capture_output=True,
                         text=True, check=True).stdout.split()
    return sum(int(b) for b in out)
