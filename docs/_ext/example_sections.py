"""Griffe extension for the API pages: read Google-style ``Example:`` sections as ``Examples:``.

The package's docstrings head their doctests ``Example:``; griffe's Google parser knows only the
plural, and would render the singular as an admonition whose ``>>>`` lines and list outputs become
Markdown text. Renaming the header lets griffe render them as code.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE_HEADER = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Rename ``Example:`` section headers to ``Examples:`` in every loaded docstring."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite the docstring of each object griffe loads, before it is parsed."""
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE_HEADER.sub(r"\1Examples:", obj.docstring.value)
