"""What the benchmarks run on bench/run_two_hosts.sh's emulated hosts
share: the script's path and the link's counters."""
import os
import subprocess

TWO_HOSTS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                         "run_two_hosts.sh")


def link_bytes():
    """Bytes the link between the hosts has carried, both ways."""
    out = subprocess.run([TWO_HOSTS, "--sent"], capture_output=True,
                         text=True, check=True).stdout.split()
    return sum(int(b) for b in out)
