"""``gpuprobe demo``: watch a real transformers ``generate()`` from the inside, on CPU.

A small Llama built from a config (random weights, nothing downloaded) serves a few requests with
sampling, a repetition penalty and a custom logits processor. gpuprobe instruments the model's real
``generate``, serves ``/metrics`` and the live page (``/``: charts in a browser) while it runs, prints one
line per request, and ends with a table of where a step's time goes (per component); ``--plot`` also
draws per-step latency by component (``gpuprobe-demo.png`` in the current folder, or the path given).
Ctrl-C ends it with one line and exit status 130 (during the requests; while it lingers, 0).

Example:
    >>> from gpuprobe.demo import main
    >>> main(["--quick", "--port", "0", "--plot", ""])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from . import probe, serve
from .errors import GpuprobeError, missing

__all__ = ["main", "PLOT"]

PLOT = "gpuprobe-demo.png"
"""The plot's file name when ``--plot`` names none (in the current folder; git-ignored in the repository)."""
EXIT_INTERRUPTED = 130


def _build_model(hidden: int, layers: int, vocab: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=1024,
                      bos_token_id=1, eos_token_id=None, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


class BanTokens:
    """A custom logits processor: the given token ids are never sampled."""

    def __init__(self, banned: list[int]) -> None:
        self.banned = banned

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        scores[:, self.banned] = -float("inf")
        return scores


@probe(kind="user")
def make_batch(batch: int, length: int, vocab: int, seed: int) -> Any:
    """Prompts for one request: random token ids (a stand-in for a tokenizer), left-padded."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    for row in range(1, batch):  # ragged prompts: pad the start of every other row
        pad = (row * 3) % max(1, length // 2)
        ids[row, :pad] = 0
        mask[row, :pad] = 0
    return ids, mask


def _series(exporter: Any) -> dict[str, list[float]]:
    """Per-step values of every component, in step order (seconds)."""
    out: dict[str, list[float]] = {}
    for ob in exporter.observations("gpuprobe.step.component.duration"):
        comp = ob.attrs.get("component", "?")
        key = f"{comp}:{ob.attrs['processor']}" if comp == "logits_processor" else comp
        out.setdefault(key, []).append(ob.value)
    return out


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _table(series: dict[str, list[float]], steps: list[float]) -> str:
    total = sum(steps) or 1.0
    order = ["forward"] + sorted(k for k in series if k.startswith("logits_processor:")) + [
        k for k in ("stopping_criteria", "streamer", "other") if k in series]
    width = max([len(k) for k in order] + [len("step (all components)")])
    lines = [f"{'component':<{width}}  {'mean ms':>8}  {'p50 ms':>8}  {'p99 ms':>8}  {'share':>6}"]
    for key in order:
        xs = series.get(key)
        if not xs:
            continue
        lines.append(f"{key:<{width}}  {statistics.fmean(xs) * 1e3:8.3f}  {_pct(xs, 0.5) * 1e3:8.3f}  "
                     f"{_pct(xs, 0.99) * 1e3:8.3f}  {sum(xs) / total:6.1%}")
    lines.append(f"{'step (all components)':<{width}}  {statistics.fmean(steps) * 1e3:8.3f}  "
                 f"{_pct(steps, 0.5) * 1e3:8.3f}  {_pct(steps, 0.99) * 1e3:8.3f}  {1:6.1%}")
    return "\n".join(lines)


def _plot(series: dict[str, list[float]], path: str, title: str) -> None:
    try:
        import matplotlib
    except ImportError as exc:
        raise missing("matplotlib", "report") from exc
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    order = ["forward"] + sorted(k for k in series if k.startswith("logits_processor:")) + [
        k for k in ("stopping_criteria", "streamer", "other") if k in series]
    n = min(len(series[k]) for k in order)
    xs = list(range(n))
    fig, ax = plt.subplots(figsize=(11, 5), dpi=110)
    ax.stackplot(xs, *[[v * 1e3 for v in series[k][:n]] for k in order],
                 labels=[k.replace("logits_processor:", "") for k in order], alpha=0.85)
    ax.set_xlabel("generation step (all requests, in order; y axis clipped at 1.4x the 98th percentile)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(title)
    ax.set_xlim(0, max(1, n - 1))
    totals = sorted(sum(series[k][i] for k in order) * 1e3 for i in xs)
    if totals:  # keep the typical step readable: outliers (a busy machine) may run off the top
        ax.set_ylim(0, max(totals[min(len(totals) - 1, round(0.98 * (len(totals) - 1)))] * 1.4, 1e-3))
    ax.legend(loc="upper left", fontsize="small", ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _interactive() -> bool:
    try:
        return sys.stdin.isatty() and sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def _linger(server: Any, seconds: float) -> None:
    """Keep the endpoint up ``seconds`` (forever: until Ctrl-C) so what was printed can be opened."""
    if seconds <= 0:
        return
    until = "Ctrl-C stops it" if seconds == float("inf") else f"for {seconds:g} s"
    print(f"\ngpuprobe demo: {server.url} stays up; {until} (and the live page: {server.page_url})", file=sys.stderr)
    try:
        if seconds == float("inf"):
            while True:
                time.sleep(3600)
        time.sleep(seconds)
    except KeyboardInterrupt:
        print("", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the process exit status (0 on success).

    Args:
        argv: command-line arguments (default ``sys.argv[1:]``); see ``--help``.

    Example:
        >>> from gpuprobe.demo import main
        >>> main(["--quick", "--port", "0", "--plot", ""])  # doctest: +SKIP
        0
    """
    p = argparse.ArgumentParser(
        prog="gpuprobe demo",
        description="Instrument a tiny transformers model's real generate() and show where the time goes.")
    p.add_argument("--requests", type=int, default=8, help="generate() calls to make (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="new tokens per request (default 48)")
    p.add_argument("--port", type=int, default=9464, help="/metrics port (default 9464; 0 picks a free one)")
    p.add_argument("--plot", nargs="?", const=PLOT, default=None, metavar="PATH.png",
                   help=f"also draw the per-step plot: to PATH.png, or {PLOT} in the current folder when no path "
                        "is given (default: none; matplotlib, the report extra)")
    p.add_argument("--layers", type=int, default=8, metavar="N", help="time decoder layers every N steps (0: off)")
    p.add_argument("--linger", type=float, default=None, metavar="SECONDS",
                   help="keep the live page and /metrics up this long after the last request (default: until "
                        "Ctrl-C when run in a terminal, else 0)")
    p.add_argument("--quick", action="store_true", help="a very small run (for tests): 2 requests of 6 tokens")
    args = p.parse_args(argv)
    if args.quick:
        args.requests, args.max_new_tokens = 2, 6
    if args.requests < 1 or args.max_new_tokens < 1:
        p.error("--requests and --max-new-tokens must be >= 1")
    if args.linger is not None and not args.linger >= 0:
        p.error("--linger must be a number of seconds >= 0")
    # In a terminal the demo keeps serving until Ctrl-C, so the URL it prints still answers; run by a
    # script or a test (no terminal) it ends when the requests are done.
    linger = args.linger if args.linger is not None else (float("inf") if _interactive() else 0.0)
    done = [0]  # requests finished, for the line Ctrl-C prints
    try:
        return _run(args, linger, done)
    except KeyboardInterrupt:  # one line, not the traceback of wherever the program was
        print(f"gpuprobe demo: interrupted (Ctrl-C) after {done[0]} of {args.requests} requests", file=sys.stderr)
        return EXIT_INTERRUPTED


def _run(args: argparse.Namespace, linger: float, done: list[int]) -> int:
    try:
        import transformers  # noqa: F401
    except ImportError:
        print(missing("transformers", "transformers"), file=sys.stderr)
        return 2
    from transformers import LogitsProcessorList

    from .integrations.transformers import instrument, uninstrument
    from .testing import InMemoryExporter

    hidden, layers, vocab = (64, 2, 256) if args.quick else (128, 4, 2048)
    model = _build_model(hidden, layers, vocab)
    instrument(model, model_name="demo-llama", layers=args.layers > 0, layer_every=max(1, args.layers))
    try:
        server = serve(port=args.port)
    except GpuprobeError as exc:
        print(f"gpuprobe demo: {exc}", file=sys.stderr)
        uninstrument(model)
        return 2
    print(f"gpuprobe demo: live page at {server.page_url} (open it in a browser); serving metrics at {server.url}",
          file=sys.stderr)
    processors = LogitsProcessorList([BanTokens([3, 4, 5])])
    batches = [1, 2, 4, 1, 2]
    exporter = InMemoryExporter().attach()
    try:
        t_all = time.perf_counter()
        tokens = 0
        for i in range(args.requests):
            batch = batches[i % len(batches)]
            ids, mask = make_batch(batch, 12 + (i % 3) * 4, vocab, seed=i)
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=mask, max_new_tokens=args.max_new_tokens, do_sample=True,
                                 temperature=0.8, top_k=50, repetition_penalty=1.2, logits_processor=processors)
            dt = time.perf_counter() - t0
            new = out.shape[0] * (out.shape[1] - ids.shape[1])
            tokens += new
            ttft = exporter.values("gen_ai.server.time_to_first_token")
            done[0] = i + 1
            print(f"request {i + 1}/{args.requests}: batch {batch}, {new} tokens in {dt:.2f} s "
                  f"({new / dt:.0f} tokens/s), time to first token {ttft[-1] * 1e3:.1f} ms", file=sys.stderr)
        wall = time.perf_counter() - t_all
        series = _series(exporter)
        steps = [ob.value for ob in exporter.observations("gpuprobe.step.duration", clock="host")]
        print(f"\n{args.requests} requests, {len(steps)} steps, {tokens} tokens in {wall:.2f} s "
              f"({tokens / wall:.0f} tokens/s); live page at {server.page_url}, metrics at {server.url}\n")
        print(_table(series, steps))
        if args.plot:
            _plot(series, args.plot, f"gpuprobe demo: per-step latency by component ({len(steps)} steps)")
            print(f"\nplot: {os.path.abspath(args.plot)}")
        elif args.plot is None:
            print(f"\n(--plot draws each step's latency by component: {PLOT} in the current folder, or --plot "
                  "PATH.png)")
        _linger(server, linger)
    finally:
        exporter.detach()
        uninstrument(model)
        server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
