"""YAML read with limits: no aliases, bounded nesting and size. Every YAML text reef_lab takes from outside (a config
file or inline mapping, a harness skill's or command's front matter) is read here, never with PyYAML's plain loaders.

Why: PyYAML's composer recurses once per nesting level (10,000 levels were a RecursionError, and a 5,000-deep skill
front matter answered every request of its scenario with 500), and an alias repeats a subtree without copying text
(a 431-byte skill expanded to a 52 MB system text on every request). Refused at parse time, with the line.
"""

from __future__ import annotations

from pathlib import Path

import yaml

MAX_CONFIG_BYTES = 1 << 20  # a config file or inline mapping (-c, --recipe-config, --engine-options)
MAX_CONFIG_DEPTH = 64  # nested mappings and lists in one


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses, at parse time and with the line, nesting deeper than MAX_CONFIG_DEPTH and
    aliases (an alias repeats a subtree, so ten levels of ten would be 10^10 nodes once passed on as JSON)."""

    def __init__(self, stream):
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise ValueError(f"line {event.start_mark.line + 1}: YAML aliases (*{event.anchor}) are not supported; "
                             "write the value out")
        nests = isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent))
        self.depth += nests
        try:
            if self.depth > MAX_CONFIG_DEPTH:
                raise ValueError(f"line {event.start_mark.line + 1}: nested deeper than {MAX_CONFIG_DEPTH} levels "
                                 "of mappings and lists")
            return super().compose_node(parent, index)
        finally:
            self.depth -= nests


def read_file(path: str, name: str) -> object:
    """load_text of an operator's file (a config, a tokens file), its size checked before it is read."""
    try:
        size = Path(path).stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ValueError(f"{name} file {path!r} is {size:,} bytes; a config may be at most "
                             f"{MAX_CONFIG_BYTES:,} bytes (1 MB)")
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{name} file {path!r} cannot be read: {e}") from None
    return load_text(text, f"{name} file {path!r}")


def load_text(text: str, name: str, max_bytes: int = MAX_CONFIG_BYTES, what: str = "a config") -> object:
    """The value of YAML/JSON `text`, refused (ValueError naming `name` and the limit) when it is over `max_bytes`,
    nested deeper than MAX_CONFIG_DEPTH, holds an alias, or is not YAML."""
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > max_bytes:
        raise ValueError(f"{name} is {size:,} bytes; {what} may be at most {max_bytes:,} bytes")
    try:
        return yaml.load(text, Loader=BoundedLoader)
    except yaml.YAMLError as e:
        raise ValueError(f"{name} is not YAML: {e}") from None
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
