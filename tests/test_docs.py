"""The documentation site: docs/ builds with Sphinx with no warning (a
broken reference or a docstring autodoc cannot read fails it), and its API
reference documents the public API. An autodoc that imports nothing still
builds, with an empty page, so the names are looked for in the output."""
import inspect
import os
import subprocess
import sys

import pytest

import nncomm

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), "docs")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The HTML site built from docs/ into a temporary folder."""
    out = tmp_path_factory.mktemp("html")
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q",
         "-b", "html", DOCS, str(out)],
        capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, \
        f"sphinx-build failed:\n{build.stdout}\n{build.stderr}"
    return out


def read_reference(site):
    with open(site / "reference.html", encoding="utf-8") as f:
        return f.read()


def documented_names():
    """What the reference must document: every name ``nncomm`` exports,
    nnabla's factory, and every public member of the communicator."""
    # A module's anchor is "module-" and its name.
    names = [("module-" if inspect.ismodule(getattr(nncomm, n)) else "") +
             f"nncomm.{n}" for n in nncomm.__all__ if n != "communicators"]
    names.append("nncomm.communicators.MultiProcessDataParallelCommunicator")
    names += [f"nncomm.Communicator.{n}" for n in dir(nncomm.Communicator)
              if not n.startswith("_")]
    return names


def test_reference_documents_the_public_api(site):
    html = read_reference(site)
    names = documented_names()
    # so that a list derived empty cannot pass
    assert {"nncomm.DistributedSolver",
            "nncomm.Communicator.all_reduce_callback"} <= set(names)
    missing = [n for n in names if f'id="{n}"' not in html]
    assert not missing, f"not in docs/reference.rst's output: {missing}"


def test_every_page_is_built(site):
    for page in ("index", "quickstart", "migrating", "callback", "groups",
                 "failures", "hangs", "reference", "api", "design", "performance"):
        assert (site / f"{page}.html").stat().st_size > 0, page
    assert (site / "_images" / "callback.svg").exists()
