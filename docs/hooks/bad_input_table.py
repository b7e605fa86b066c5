"""MkDocs hook: fill ``<!-- duoloss:bad-input-table -->`` with the bad-input table.

The table is not kept in the docs: at build time every case of
``tests/bad_inputs.py`` is run through its first frontend (torch where it exists,
else jax or ``duoloss.gtn``) and the exceptions raised are written into the page,
so the page always shows the messages users get today.  ``tests/test_docs.py``
builds the same table and checks it against the cases.
"""
from __future__ import annotations

import sys
from pathlib import Path

PLACEHOLDER = "<!-- duoloss:bad-input-table -->"
_TESTS = Path(__file__).resolve().parents[2] / "tests"


def bad_input_table() -> str:
    """The Markdown table of every bad-input case and the exception it raises."""
    if str(_TESTS) not in sys.path:
        sys.path.insert(0, str(_TESTS))
    import bad_inputs

    rows = [(case, bad_inputs.call(case, case.frameworks[0])) for case in bad_inputs.all_cases()]
    return bad_inputs.markdown_table(rows)


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001 - MkDocs hook signature
    if PLACEHOLDER not in markdown:
        return markdown
    return markdown.replace(PLACEHOLDER, bad_input_table())
