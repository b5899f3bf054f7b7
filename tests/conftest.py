"""Shared pytest configuration: the markers the suite uses."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA GPU and CuPy; skipped without one")
