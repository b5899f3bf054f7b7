"""Shared pytest configuration: the markers the suite uses, and where the
jobs it starts write their flight records."""
import os

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA GPU and CuPy; skipped without one")


@pytest.fixture(scope="session", autouse=True)
def flight_records_in_a_temporary_folder(tmp_path_factory):
    """Jobs that fail on purpose write flight records (a rank ended while
    it writes one leaves a temporary file): into pytest's temporary folder,
    not the user's default one. Tests that read records set their own."""
    if "NNCOMM_FLIGHT_RECORDER_DIR" not in os.environ:
        os.environ["NNCOMM_FLIGHT_RECORDER_DIR"] = str(
            tmp_path_factory.mktemp("flight-records"))
