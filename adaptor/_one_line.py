"""Text shown on one line: a listing's item, a message naming a path.

What an agent or a user named (a thread key, an approval's title, a home's path) may hold a
newline or a terminal escape; shown as it is, it splits the line or drives the terminal.
"""

from __future__ import annotations

import json

import orjson


def one_line(text: str) -> str:
    """``text`` as one line of a listing or a message: JSON-quoted when it holds a newline, a
    terminal escape or another character that is not printable, to a pipe too (--json has it
    as it is)."""
    return text if text.isprintable() else quoted(text)


def quoted(text: str) -> str:
    """``text`` JSON-quoted, with what JSON leaves as it is but is no printable character (a
    right-to-left override that reorders the line, a zero-width space) escaped too."""
    try:
        as_json = orjson.dumps(text).decode()
    except TypeError:
        # A lone surrogate: an undecodable byte of a path, as os.fsdecode keeps it (a home
        # named in latin-1), which orjson refuses; escaped below as JSON writes it.
        as_json = json.dumps(text, ensure_ascii=False)
    if as_json.isprintable():
        return as_json
    return "".join(char if char.isprintable() else _json_escape(char) for char in as_json)


def _json_escape(char: str) -> str:
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as JSON writes a character past the BMP
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
