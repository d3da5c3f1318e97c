"""Integrations with libraries that run generation; each is imported on its own, when used.

- :mod:`gpuprobe.integrations.transformers` — Hugging Face transformers ``generate()``:
  :func:`~gpuprobe.integrations.transformers.instrument` /
  :func:`~gpuprobe.integrations.transformers.uninstrument` per model,
  :func:`~gpuprobe.integrations.transformers.instrument_all` for every model in the process.
- :mod:`gpuprobe.integrations.opentelemetry` — the OpenTelemetry instrumentor that
  ``opentelemetry-instrument`` loads (transformers, and gpuprobe's metrics into a ``MeterProvider``).

Importing this package imports nothing optional; ``gpuprobe`` itself never imports an integration.
"""

from __future__ import annotations

__all__: list[str] = []
