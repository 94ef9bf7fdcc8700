"""A griffe extension for the docs build: Sphinx roles in docstrings become cross-references.

It also turns reStructuredText's ``::`` (a literal block follows) into Markdown (the
indented block then renders as code, without a stray ``::``), and corrects one griffe
limitation: parameters documented together (``shuffle, seed:``) get each its own type and
default from the signature, not the first one's.

feedline's numpy-style docstrings name other objects with Sphinx roles
(``:class:`~feedline.loader.data.windows.Windows```, ``:meth:`state_dict```). Markdown does not know
them, so this rewrites each into an *optional* mkdocs-autorefs reference: a link where the
target is rendered somewhere in the site, plain code where it is not (an optional reference
never fails the ``--strict`` build). ``~a.b.c`` shows ``c``, as in Sphinx; a bare name is looked
up on the object's class or module first.

Loaded by mkdocstrings-python from ``mkdocs.yml`` (``extensions: [docs/_ext/sphinx_roles.py]``);
nothing in the ``feedline`` package imports it.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLES = "class|func|meth|mod|attr|data|exc|obj|const"
_ROLE = re.compile(rf":(?:py:)?(?:{_ROLES}):`(~?)([^`<>]+?)(\(\))?`")
_GROUPED = re.compile(r" *(\w+(?:, *\w+)+) *:? *")
_LITERAL_ALONE = re.compile(r"^[ \t]*::[ \t]*$", re.MULTILINE)
_LITERAL_END = re.compile(r"(?<=\S)::[ \t]*$", re.MULTILINE)


def _scope(obj: griffe.Object) -> str:
    """Path under which a bare name in ``obj``'s docstring is looked up."""
    if obj.is_function and obj.parent is not None and obj.parent.is_class:
        return obj.parent.path
    if obj.is_class or obj.is_module:
        return obj.path
    return obj.parent.path if obj.parent is not None else obj.path


def rewrite(text: str, scope: str) -> str:
    """Replace every Sphinx role in ``text`` with an optional autorefs reference."""

    def one(match: re.Match[str]) -> str:
        short, target, call = match.group(1), match.group(2).strip(), match.group(3) or ""
        shown = target.rsplit(".", 1)[-1] if short else target
        identifier = target if "." in target else f"{scope}.{target}"
        return f'<autoref identifier="{identifier}" optional><code>{shown}{call}</code></autoref>'

    text = _ROLE.sub(one, text)
    return _LITERAL_END.sub(":", _LITERAL_ALONE.sub("", text))


def split_grouped(text: str) -> str:
    """Give each parameter of a grouped line (``shuffle, seed:``) its own entry.

    griffe's numpy parser gives every name of such a line the first name's type and default
    (``seed`` would show ``bool = True``); one entry per name, each with the shared
    description, lets it take each type and default from the signature.
    """
    lines, out, in_parameters, i = text.splitlines(), [], False, 0
    while i < len(lines):
        line = lines[i]
        underline = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if line.strip() and len(underline) >= 3 and set(underline) == {"-"}:
            in_parameters = line.strip() in ("Parameters", "Other Parameters")
            out += [line, lines[i + 1]]
            i += 2
            continue
        grouped = _GROUPED.fullmatch(line) if in_parameters else None
        if grouped is None:
            out.append(line)
            i += 1
            continue
        indent = len(line) - len(line.lstrip())
        j = i + 1
        while j < len(lines) and (
            not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent
        ):
            j += 1
        description = lines[i + 1 : j]
        blank = 0
        while blank < len(description) and not description[-1 - blank].strip():
            blank += 1
        kept = description[: len(description) - blank]
        for name in grouped.group(1).split(","):
            out += [f"{' ' * indent}{name.strip()}:", *kept]
        out += [""] * blank
        i = j
    return "\n".join(out)


class SphinxRoles(griffe.Extension):
    """Rewrite the Sphinx roles of every loaded object's docstring (see the module docstring)."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring in place, before it is parsed."""
        if obj.docstring is None:
            return
        if ":" in obj.docstring.value:
            obj.docstring.value = rewrite(obj.docstring.value, _scope(obj))
        if "," in obj.docstring.value:
            obj.docstring.value = split_grouped(obj.docstring.value)
