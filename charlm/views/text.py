"""Model text is shown literally: never parsed as markup, and control characters made visible, so
text full of ANSI/OSC escapes or BEL cannot drive the user's terminal."""

from __future__ import annotations

import unicodedata

# bidirectional overrides and isolates can reorder what the terminal shows ("Trojan Source")
_BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")


def _visible(ch: str) -> str:
    if ch in "\n\t":
        return ch
    if ch == "\r":
        return "\\r"
    if unicodedata.category(ch) == "Cc" or ch in _BIDI:
        code = ord(ch)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return ch


def safe_text(text: str) -> str:
    """text with every control character (but newline and tab) written as an escape like \\x1b."""
    if text.isprintable():  # fast path: nothing to escape (isprintable is False for \n too)
        return text
    return "".join(_visible(ch) for ch in text)
