"""Raw readers of trace files for independent expectations (a module of its own name: test modules
import it directly, where ``from conftest import ...`` could find another folder's conftest)."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any


def read_trace(path: str | Path) -> dict[str, Any]:
    """The whole trace with plain json, numbers with a fraction as Decimal (exact)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        return json.load(f, parse_float=Decimal)


def to_ns(value: Any) -> int:
    """Microseconds (int or Decimal) to integer nanoseconds."""
    return int(Decimal(value) * 1000)
