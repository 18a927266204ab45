"""XML parsed safely for the XML formats (XLIFF, Android resources): no DTD, so no entity expansion (billion laughs)
and no external entity (XXE); lxml's parser with network access and huge trees off. Comments, CDATA and
processing instructions are kept."""

from __future__ import annotations

from typing import Any

from lxml import etree

from service.files.catalogue import FileError

PARSER_OPTIONS = {"resolve_entities": False, "no_network": True, "huge_tree": False, "strip_cdata": False}


def parsed(data: bytes, filename: str, what: str) -> Any:
    """The document's tree; FileError 400 for a DOCTYPE (entities are refused, not expanded) or malformed XML,
    with the line and column."""
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
        raise FileError(400, f"{filename}: {what} may not declare a DOCTYPE or entities (they are not expanded here)")
    try:
        root = etree.fromstring(data, etree.XMLParser(**PARSER_OPTIONS))
    except etree.XMLSyntaxError as error:
        line, column = error.position if error.position else (0, 0)
        raise FileError(400, f"{filename}: not well-formed XML at line {line}, column {column}: {error.msg}") from None
    if root.getroottree().docinfo.doctype:  # declared in an encoding the byte check above cannot read
        raise FileError(400, f"{filename}: {what} may not declare a DOCTYPE or entities (they are not expanded here)")
    return root


def serialised(root: Any) -> bytes:
    return etree.tostring(root.getroottree(), xml_declaration=True, encoding="utf-8")


def local(element: Any) -> str:
    """An element's tag without its namespace ('' for a comment or processing instruction)."""
    return etree.QName(element).localname if isinstance(element.tag, str) else ""
