"""Sphinx configuration of nncomm's documentation site.

Build it with ``python -m sphinx -W -b html docs docs/_build/html`` where
``import nncomm`` finds the built package (after ``./bootstrap.sh``, or
with ``PYTHONPATH=python`` after ``setup.py build_ext --inplace``): the API
reference is made from the docstrings of the imported modules.
"""
project = "nncomm"
author = "nncomm's authors"
copyright = "nncomm's authors"
release = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]

# Google-style sections (Args, Returns, Example), as nnabla's docstrings.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"

# The markdown pages link their sections by title.
myst_heading_anchors = 3

# Every reference must resolve, so that a misspelt :meth: in a docstring
# fails the build; nnabla's, numpy's and the standard library's names stay
# plain text (no intersphinx: the build reaches no network).
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(nnabla\.)?(NdArray|Context|Variable|solver)(\..*)?"),
    (r"py:exc", r"pickle\..*"),
    # words napoleon takes for types: "callable", "numpy dtype", ...
    (r"py:class", r"callable|sequence|array|numpy dtype"),
]

html_theme = "alabaster"
# Room for the API's signatures, code examples and the callback's picture.
html_theme_options = {"page_width": "1160px", "body_max_width": "none"}
