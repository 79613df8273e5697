"""The keyword section of the plastic algorithms' docstrings, generated from the config dataclasses.

The plastic keywords (:class:`~sb3_plastic.config.IsometryConfig`) and the intervention keywords (the config
classes of :func:`~sb3_plastic.common.plastic_algorithm.intervention_config_classes`) are documented once, in
the ``:param name: text`` lines of those dataclasses' docstrings. :func:`keyword_docs` turns them into one
SB3-style ``:param ...:`` section with each keyword's default, and
:class:`~sb3_plastic.common.plastic_algorithm.PlasticAlgorithmMixin` appends that section to the docstring of
every plastic algorithm class when the class is created, so ``help(PlasticPPO)`` lists every keyword and a
new config field appears there without further work.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Mapping
from typing import Any, Optional

#: First line of the generated section (also how :func:`with_keyword_docs` recognises a docstring that has it).
SECTION_MARKER = "Plastic keywords (in addition to the constructor arguments of the SB3 / sb3-contrib algorithm):"

#: Description of a field whose config docstring has no ``:param`` line for it (a test checks there is none).
UNDOCUMENTED = "(not documented in its config class)"

_PARAM = re.compile(r"^:param\s+(\w+)\s*:\s*(.*)$")


def param_docs(docstring: Optional[str]) -> dict[str, str]:
    """The ``:param name: text`` entries of a docstring, continuation lines joined with single spaces.

    An entry is its ``:param`` line and the indented lines after it (whatever they start with, e.g. a
    ``:func:`` role); it ends at a blank line or at the next line that is not indented.

    :param docstring: a docstring (``None``: no entries).
    :return: name -> description.
    """
    entries: dict[str, str] = {}
    name: Optional[str] = None
    parts: list[str] = []
    for line in inspect.cleandoc(docstring or "").splitlines():
        match = _PARAM.match(line)
        if match:
            if name is not None:
                entries[name] = " ".join(parts)
            name, parts = match.group(1), [match.group(2).strip()]
        elif name is not None and line.strip() and line[:1].isspace():
            parts.append(line.strip())
        elif name is not None:
            entries[name] = " ".join(parts)
            name, parts = None, []
    if name is not None:
        entries[name] = " ".join(parts)
    return entries


def config_param_docs(config_cls: type, defaults: Optional[Mapping[str, Any]] = None) -> list[tuple[str, str, Any]]:
    """``(name, description, default)`` for every field of a config dataclass, in field order.

    :param config_cls: a dataclass whose docstring documents its fields with ``:param name: text``.
    :param defaults: defaults that replace the dataclass's own (e.g. the algorithm's signature defaults).
    :return: one entry per field; a field without a ``:param`` line gets :data:`UNDOCUMENTED`.
    :raises TypeError: if ``config_cls`` is not a dataclass.
    """
    if not (isinstance(config_cls, type) and dataclasses.is_dataclass(config_cls)):
        raise TypeError(f"config_cls must be a dataclass type, got {config_cls!r}")
    docs = param_docs(config_cls.__doc__)
    defaults = dict(defaults or {})
    entries = []
    for field in dataclasses.fields(config_cls):
        if field.name in defaults:
            default = defaults[field.name]
        elif field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = dataclasses.MISSING
        entries.append((field.name, docs.get(field.name, UNDOCUMENTED), default))
    return entries


def _format_entry(name: str, description: str, default: Any, width: int = 110, prefix: Optional[str] = None) -> list[str]:
    """``:param name: description Default: ...`` wrapped at ``width``, continuation lines indented by 4."""
    text = description if default is dataclasses.MISSING else f"{description} Default: ``{default!r}``."
    lines: list[str] = []
    line = f":param {name}:" if prefix is None else prefix
    indent = "    " if prefix is None else prefix
    for word in text.split():
        if len(line) + 1 + len(word) > width and line.strip():
            lines.append(line)
            line = indent + word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return lines


def keyword_docs(groups: Mapping[str, tuple[type, Optional[Mapping[str, Any]]]], intro: str = "") -> str:
    """The generated keyword section: a heading per config class, then its ``:param`` lines with defaults.

    :param groups: heading -> ``(config dataclass, defaults overriding the dataclass's, or None)``.
    :param intro: a paragraph after the first line.
    :return: the section (starting with :data:`SECTION_MARKER`), lines without indentation.
    """
    lines = [SECTION_MARKER]
    if intro:
        lines += ["", *_format_entry("", intro, dataclasses.MISSING, prefix="")]
    for heading, (config_cls, defaults) in groups.items():
        lines += ["", f"{heading} (:class:`~{config_cls.__module__}.{config_cls.__qualname__}`):", ""]
        for name, description, default in config_param_docs(config_cls, defaults):
            lines += _format_entry(name, description, default)
    return "\n".join(lines)


def with_keyword_docs(docstring: Optional[str], section: str) -> Optional[str]:
    """``docstring`` with ``section`` appended (indented like the docstring's body); unchanged when it is
    ``None`` (``help()`` then shows the documented parent's docstring) or already has the section."""
    if docstring is None or SECTION_MARKER in docstring:
        return docstring
    body = docstring.expandtabs().splitlines()[1:]
    indents = [len(line) - len(line.lstrip()) for line in body if line.strip()]
    indent = " " * (min(indents) if indents else 0)
    appended = "\n".join(indent + line if line else "" for line in section.splitlines())
    return f"{docstring.rstrip()}\n\n{appended}\n{indent}"
