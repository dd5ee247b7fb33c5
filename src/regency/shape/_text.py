"""How Monarch's Rust core writes labels in reprs, so regency's reprs read the same."""

from __future__ import annotations

_SIMPLE_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}


def quoted(text: str) -> str:
    r"""``text`` in double quotes with Rust's ``Debug`` escapes: ``a"b`` -> ``"a\"b"``."""
    out = []
    for ch in text:
        escape = _SIMPLE_ESCAPES.get(ch)
        if escape is not None:
            out.append(escape)
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(f"\\u{{{ord(ch):x}}}")
    return '"' + "".join(out) + '"'


def label_key(label: str) -> str:
    """An extent label as a map key: bare when it is ASCII letters, digits and ``_``."""
    if all(ch.isascii() and (ch.isalnum() or ch == "_") for ch in label):
        return label
    return quoted(label)
