"""Aggregates: the batch path equals the per-value path; exposition helpers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuprobe._metrics import SPECS, Registry, prometheus_name

DUR = "gpuprobe.probe.duration"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=200_000_000_000), min_size=1, max_size=300),
       st.integers(min_value=1, max_value=7))
def test_batch_aggregation_equals_one_value_at_a_time(values: list[int], chunks: int) -> None:
    reg = Registry()
    one = reg.family(DUR).child(probe="one", kind="user", clock="host")
    batch = reg.family(DUR).child(probe="batch", kind="user", clock="host")
    for v in values:
        one.apply(v)
    size = max(1, len(values) // chunks)
    for i in range(0, len(values), size):
        batch.apply_many(list(values[i:i + size]))
    assert batch.counts == one.counts  # type: ignore[attr-defined]
    assert (batch.sum, batch.min, batch.max, batch.count) == (one.sum, one.min, one.max, one.count)  # type: ignore[attr-defined]


def test_values_on_a_bucket_bound_count_in_that_bucket() -> None:
    child = Registry().family(DUR).child(probe="edge", kind="user", clock="host")
    bound_ns = child.bounds[3]  # type: ignore[attr-defined]
    child.apply_many([bound_ns, bound_ns + 1])  # type: ignore[attr-defined]
    assert child.counts[3] == 1 and child.counts[4] == 1  # type: ignore[attr-defined]


def test_prometheus_names_follow_the_otel_rules() -> None:
    names = {name: prometheus_name(spec) for name, spec in SPECS.items()}
    assert names["gen_ai.server.time_to_first_token"] == "gen_ai_server_time_to_first_token_seconds"
    assert names["gen_ai.client.token.usage"] == "gen_ai_client_token_usage"
    assert names["gpuprobe.memory.allocated"] == "gpuprobe_memory_allocated_bytes"
    assert names["gpuprobe.kernel.time"] == "gpuprobe_kernel_time_seconds"
    assert len(set(names.values())) == len(names)


def test_metrics_reference_is_current() -> None:
    from pathlib import Path

    from gpuprobe._docs import fill_tables

    doc = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"
    text = doc.read_text(encoding="utf-8")
    assert fill_tables(text) == text, "docs/metrics.md is stale: run python -m gpuprobe._docs"
