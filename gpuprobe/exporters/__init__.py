"""Exporters: each module imports its own library (prometheus_client, opentelemetry), nothing else does."""
