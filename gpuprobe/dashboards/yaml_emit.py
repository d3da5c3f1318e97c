"""YAML text of Prometheus configuration and rule files, written with PyYAML (the ``dashboard`` extra).

The only module of gpuprobe that imports ``yaml``; it does so on first use, so the rest of
:mod:`gpuprobe.dashboards` (the Grafana JSON) works without it.

Style: block style, list items indented under their key, keys in the order given, and every string
that is not a plain name (PromQL, durations, host:port, templates) double-quoted, so no value can be
read back as another type (``5s``, ``0123``, ``yes``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from ..errors import missing

__all__ = ["to_yaml"]

_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")
_RESERVED = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


@functools.lru_cache(maxsize=None)
def _dump() -> Callable[[Any], str]:
    try:
        import yaml
    except ImportError:
        raise missing("PyYAML", "dashboard") from None

    class Dumper(yaml.SafeDumper):
        def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
            super().increase_indent(flow, False)  # "key:\n  - item", not "key:\n- item"

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        plain = _PLAIN.match(value) and value.lower() not in _RESERVED
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=None if plain else '"')

    Dumper.add_representer(str, text)
    Dumper.add_representer(tuple, Dumper.represent_list)

    def dump(value: Any) -> str:
        return str(yaml.dump(value, Dumper=Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True,
                             width=2**31 - 1, indent=2))  # width: never fold a long PromQL line

    return dump


def to_yaml(value: Any) -> str:
    """Block-style YAML of dicts, lists, tuples and scalars.

    Raises:
        MissingDependencyError: PyYAML is not installed (``pip install 'gpuprobe[dashboard]'``).

    Example:
        >>> print(to_yaml({"a": [1, "b c"], "for": "5m"}), end="")
        a:
          - 1
          - "b c"
        for: "5m"
    """
    return _dump()(value)
