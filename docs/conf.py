"""Sphinx configuration of mxamp's documentation site.

Build it (after ``python -m pip install -e ".[docs]"``) with::

    python -m sphinx -W --keep-going -n -b html docs docs/_build/html

The pages are MyST Markdown; the API reference is autodoc of the docstrings
(NumPy style, read by napoleon) and the command-line reference sphinx-click
of the click commands, so neither can drift from the code.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # mxamp from this checkout, as an editable install has it

import mxamp  # noqa: E402

project = "mxamp"
author = "the mxamp authors"
copyright = "the mxamp authors"  # noqa: A001 (Sphinx's name)
release = version = mxamp.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx_click",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "results/*.json"]
root_doc = "index"

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# NumPy-style docstrings; parameter and return types stay text (MXNet's and
# numpy's types have no documentation here to link to), while every
# :func: / :class: / :mod: role must resolve (-n).
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_param = False
napoleon_use_rtype = False
napoleon_use_ivar = True
autodoc_member_order = "bysource"
autodoc_typehints = "none"
autodoc_default_options = {"members": True}
# Importing mxamp loads MXNet but builds and loads no C++ library
# (tests/test_architecture.py), so autodoc needs no mocks.

html_theme = "furo"
html_title = f"mxamp {release}"
html_static_path = []
nitpicky = True
# Types outside mxamp (MXNet's, numpy's, Python's) have no pages here to link
# to; every reference to an mxamp name must resolve.
nitpick_ignore_regex = [(r"py:(class|exc|obj|data)", r"(?!mxamp\.).*")]

# Names that submodules share with the top-level package are documented
# once, as ``mxamp.NAME``; the submodule's page skips them.
_TOP_LEVEL = {name: getattr(mxamp, name) for name in mxamp.__all__}
_current_module = []


def _note_module(app, what, name, obj, options, lines):
    if what == "module":
        _current_module[:] = [name]


def _skip_top_level_names(app, what, name, obj, skip, options):
    module = _current_module[0] if _current_module else "mxamp"
    if module != "mxamp" and what == "module" and _TOP_LEVEL.get(name) is obj \
            and obj is not None:
        return True
    return None


def setup(app):
    app.connect("autodoc-process-docstring", _note_module)
    app.connect("autodoc-skip-member", _skip_top_level_names)
