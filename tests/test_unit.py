"""The C++ unit tests (tests/unit/): the engine, the bucket runner on host memory, the
list collectives, the launch tuner, the readiness counts, the waits,
fail_together, the timeline and the flight recorder, on an in-process
fake transport, without MPI. The program is built once per session from
tests/unit/ and the core's MPI-free sources; each C++ test runs in a
process of its own, under the settings it is about where it has some
(settings are read once per process)."""
import concurrent.futures
import glob
import os
import re
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNIT = os.path.join(REPO, "tests", "unit")
# The core's sources that the tested code needs, none of them MPI's.
CORE = ["src/core/engine.cpp", "src/core/bucket_runner.cpp",
        "src/core/array_memory.cpp", "src/core/wait.cpp",
        "src/core/broken_process.cpp", "src/core/bucket_plan.cpp",
        "src/core/pack.cpp", "src/core/fusion_buffer.cpp",
        "src/core/launch_tuner.cpp", "src/core/readiness.cpp",
        "src/core/owner_reduction.cpp",
        "src/transports/transport.cpp", "src/transports/host_layout.cpp",
        "src/collectives/list_collectives.cpp", "src/host/elementwise.cpp",
        "src/host/huge_pages.cpp", "src/observability/config.cpp",
        "src/observability/flight_recorder.cpp",
        "src/observability/timeline.cpp"]
# -march=native: the vector float16 kernels are built where the processor
# has F16C, as setup.py builds the modules.
FLAGS = ["-std=c++17", "-O1", "-g", "-march=native", "-Iinclude",
         "-Itests/unit"]

# Every test: direct arrays of hundreds of elements rather than a MiB's
# worth, the same code at a fraction of the time.
BASE = {"NNCOMM_DIRECT_BYTES": "2048"}
LAUNCHES = [{"NNCOMM_LAUNCH": launch}
            for launch in ("eager", "deferred", "auto")]
# Tests run once under each of these settings; the others under BASE only.
SETTINGS = {
    "engine_reduces_random_plans_in_plan_order": LAUNCHES,
    "engine_serves_every_plan_of_its_gradients": LAUNCHES,
    "engine_launches_as_the_schedule_says": LAUNCHES,
    "engine_tuner_decides_alike_on_every_rank": LAUNCHES,
    "engine_priority_reduces_random_plans_in_priority_order": LAUNCHES,
    "engine_priority_order_whatever_order_ranks_are_ready_in": LAUNCHES,
    "engine_priority_failed_rank_sends_zeros_and_fails_every_rank":
        LAUNCHES,
    # Lone arrays of 32 KiB, below the default direct threshold.
    "lone_arrays_are_sent_where_they_lie": [
        {"NNCOMM_DIRECT_BYTES": str(1 << 20)}],
    "collectives_compare_calls_as_configured": [
        {}, {"NNCOMM_CHECK_CALLS": "1"}, {"NNCOMM_CHECK_CALLS": "0"}],
    "wait_timeout_names_missing_world_ranks_then_aborts_the_job": [
        {"NNCOMM_TIMEOUT": "1"}],
}


def cxx_tests():
    """The C++ tests' names, from their sources (collection comes before
    the build)."""
    names = []
    for path in sorted(glob.glob(os.path.join(UNIT, "test_*.cpp"))):
        with open(path) as f:
            names += re.findall(r"^TEST\((\w+)\)", f.read(), re.MULTILINE)
    return names


def cases():
    for name in cxx_tests():
        for settings in SETTINGS.get(name, [{}]):
            label = ",".join(f"{k}={v}" for k, v in settings.items())
            yield pytest.param(name, settings,
                               id=f"{name}[{label}]" if label else name)


@pytest.fixture(scope="session")
def unit_program(tmp_path_factory):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ on this machine: the C++ unit tests need one")
    build = tmp_path_factory.mktemp("unit")
    sources = CORE + sorted(
        os.path.relpath(p, REPO)
        for p in glob.glob(os.path.join(UNIT, "*.cpp")))
    objects = [str(build / (s.replace("/", "_") + ".o")) for s in sources]

    def compile_one(source, obj):
        return subprocess.run([gxx] + FLAGS + ["-c", source, "-o", obj],
                              cwd=REPO, capture_output=True, text=True,
                              timeout=600)

    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
        compiled = list(pool.map(compile_one, sources, objects))
    failed = [c.stderr for c in compiled if c.returncode != 0]
    assert not failed, "\n".join(failed)
    program = str(build / "unit")
    subprocess.run([gxx] + objects + ["-pthread", "-o", program], cwd=REPO,
                   check=True, timeout=300)
    return program


def test_every_cxx_test_is_collected(unit_program):
    listed = subprocess.run([unit_program, "--list"], capture_output=True,
                            text=True, check=True).stdout.split()
    assert sorted(listed) == sorted(cxx_tests())


@pytest.mark.parametrize("name,settings", list(cases()))
def test_cxx(unit_program, name, settings):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NNCOMM_")}
    env.update(BASE)
    env.update(settings)
    out = subprocess.run([unit_program, name], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == "unit: 1 tests passed", out.stdout
