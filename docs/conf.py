"""Sphinx configuration: the Markdown pages of docs/ (MyST) and an API
reference generated from the docstrings.

    sphinx-build -W -b html docs build/docs     # warnings are errors
"""
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

# importing erdmampi.MPI must not start an engine (as mpi4py's rc.initialize)
import erdmampi  # noqa: E402

erdmampi.rc.initialize = False

# erdmampi.MPI's docstrings start with a signature line, as mpi4py's (see
# erdmampi/_docsig.py); autodoc reads the signatures from the code instead
# (the names of the constants used as defaults, no ``self``)
import erdmampi.MPI  # noqa: E402
from erdmampi import _docsig  # noqa: E402

_docsig.unsign()

project = "erdmampi"
author = "the erdmampi authors"
release = version = erdmampi.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]

# headings get anchors, so that page.md#section links are checked
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

autodoc_default_options = {"members": True, "undoc-members": True, "member-order": "bysource"}
autodoc_typehints = "none"
autodoc_preserve_defaults = True

html_theme = "alabaster"
html_title = "erdmampi"
