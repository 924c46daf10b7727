"""Griffe extension for the API pages: read the package's docstrings the way Markdown needs them.

The docstrings are Google style with two habits Markdown does not share:

- doctests are headed ``Example:``; griffe's Google parser knows only the plural and would
  render the singular as an admonition whose ``>>>`` lines and list outputs become Markdown text;
- cross-references use Sphinx roles (``:class:`~recsys_midx.samplers.Sampler```), which Markdown
  prints literally; they become code spans of the name Sphinx would show.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE_HEADER = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
_SPHINX_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj):`(~?)([^`]+)`")


def _code_span(match: re.Match[str]) -> str:
    """``~a.b.C`` shows ``C``, as Sphinx does; a plain target shows whole."""
    shorten, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if shorten else target}`"


class MarkdownDocstrings(griffe.Extension):
    """Rename ``Example:`` headers to ``Examples:`` and turn Sphinx roles into code spans."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite the docstring of each object griffe loads, before it is parsed."""
        if obj.docstring is not None:
            text = _EXAMPLE_HEADER.sub(r"\1Examples:", obj.docstring.value)
            obj.docstring.value = _SPHINX_ROLE.sub(_code_span, text)
