"""Every pipeline class diffusers ships, built from tiny configs where this script knows how, called plain and
instrumented with the same seed: the same output, and one measured step per denoising step.

How a pipeline is built: each parameter of its ``__init__`` is made from its annotation's class (a UNet, a
transformer, a VAE, a CLIP or T5 text encoder, a tokenizer trained here, a scheduler), with one set of tiny
dimensions that fit each other (the text encoders' width is the denoiser's cross-attention width; SDXL's
UNet where the pipeline takes a second text encoder); an optional component it cannot make is ``None``.
The call gets a prompt, 2 steps, a seeded generator, a 32×32 size, an image (and mask) where it takes one,
and ``callback_on_step_end`` where it takes one: the callback's calls are the step count's oracle (without
one, the 2 steps asked for).

Each class ends in one state (the counts are printed):

- ``measured``: built, called, the instrumented output equal to the plain one, steps equal to the callback's
  (or to the steps asked for);
- ``differs``: built and called, but the output or the step count is not what it should be (a finding);
- ``not built``: a component this script cannot make from a config (a model it has no recipe for, or
  dimensions that do not fit the recipes), or the class cannot be imported here;
- ``not called``: built, but its plain call fails with these inputs (it needs inputs of its own kind), or
  takes longer than ``--timeout`` seconds (a pipeline that resizes its inputs to its own 1024×1024).

The classes run one after another in a worker process (``--worker``: names on its standard input, one JSON
row each on its output); a class that runs past ``--timeout`` has its worker killed, and a new one goes on
with the next class (a torch operator on a large tensor cannot be interrupted from inside the process).

Usage::

    python scripts/diffusers_sweep.py                  # every class
    python scripts/diffusers_sweep.py --sample 8       # 8 classes, the same ones each run (CI runs a sample)
    python scripts/diffusers_sweep.py --only StableDiffusionPipeline,FluxPipeline --json

Exit status: 1 when a class ``differs``, else 0.
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import subprocess
import sys
import threading
import time
import typing
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "diffusers"))

STATES = ("measured", "differs", "not built", "not called")
STEPS = 2
"""num_inference_steps of every call."""


class CannotBuild(Exception):
    """A component this script has no recipe for, or whose recipe does not fit the pipeline."""


def _annotation_names(annotation: Any) -> list[str]:
    """The class names an annotation allows (``A | B``, ``Optional[A]``, a string)."""
    if annotation is inspect.Parameter.empty or annotation is None:
        return []
    if isinstance(annotation, str):
        return [part.strip().strip("'\"") for part in annotation.replace("Optional[", "").rstrip("]").split("|")]
    args = typing.get_args(annotation)
    if args:
        return [n for a in args for n in _annotation_names(a)]
    return [getattr(annotation, "__name__", str(annotation))]


class Factory:
    """Tiny components with dimensions that fit each other: those of the reference pipeline of the pipeline's
    family (Flux, SD3, SDXL, else Stable Diffusion with a ControlNet) by name and class, then one recipe per
    class name."""

    def __init__(self, pipeline: type, params: dict[str, list[str]]) -> None:
        import _pipes

        self.p = _pipes
        classes = {c for names in params.values() for c in names}
        if "FluxTransformer2DModel" in classes:
            reference = _pipes.flux()
        elif "SD3Transformer2DModel" in classes:
            reference = _pipes.sd3()
        elif "text_encoder_2" in params and "UNet2DConditionModel" in classes:
            reference = _pipes.sdxl()
        else:
            reference = _pipes.controlnet()
        self.reference = {k: v for k, v in reference.components.items() if v is not None}

    def make(self, name: str, classes: list[str]) -> Any:
        found = self.reference.get(name)
        if found is not None and type(found).__name__ in classes:
            return found
        for value in self.reference.values():  # the same class under another name (text_encoder_2 -> text_encoder)
            if type(value).__name__ in classes and name.rstrip("_0123456789") == type(value).__name__.lower():
                return value
        p = self.p
        torch, diffusers, transformers = p.torch, p.diffusers, p.transformers
        for cls in classes:
            torch.manual_seed(0)
            if cls == "UNet2DModel":
                return diffusers.UNet2DModel(sample_size=8, block_out_channels=(4, 8), layers_per_block=1,
                                             norm_num_groups=2, down_block_types=("DownBlock2D", "DownBlock2D"),
                                             up_block_types=("UpBlock2D", "UpBlock2D"))
            if cls in ("UNet2DConditionModel", "AutoencoderKL", "CLIPTextModel", "ControlNetModel"):
                for value in self.reference.values():
                    if type(value).__name__ == cls:
                        return value
            if cls == "CLIPTextModelWithProjection":
                return transformers.CLIPTextModelWithProjection(p._clip_config())
            if cls in ("CLIPTokenizer", "CLIPTokenizerFast"):
                return p.clip_tokenizer()
            if cls == "T5EncoderModel":
                return p._t5_encoder()
            if cls in ("T5Tokenizer", "T5TokenizerFast"):
                return p.t5_tokenizer()
            if cls == "PixArtTransformer2DModel":
                return diffusers.PixArtTransformer2DModel(
                    sample_size=8, num_layers=1, patch_size=2, attention_head_dim=8, num_attention_heads=3,
                    caption_channels=32, in_channels=4, cross_attention_dim=24, out_channels=8,
                    attention_bias=True, activation_fn="gelu-approximate", num_embeds_ada_norm=1000,
                    norm_type="ada_norm_single", norm_elementwise_affine=False, norm_eps=1e-6)
            scheduler = getattr(diffusers, cls, None)
            if cls in ("KarrasDiffusionSchedulers", "SchedulerMixin"):
                return diffusers.DDIMScheduler(steps_offset=1)
            if isinstance(scheduler, type) and issubclass(scheduler, diffusers.SchedulerMixin):
                return scheduler()
        raise CannotBuild(f"{name}: no recipe for {' | '.join(classes) or 'an unannotated parameter'}")


def build(cls: type) -> Any:
    """``cls`` built from tiny components (CannotBuild when one cannot be made)."""
    sig = inspect.signature(cls.__init__)
    params = {n: _annotation_names(p.annotation) for n, p in sig.parameters.items() if n != "self"}
    optional = set(getattr(cls, "_optional_components", []) or [])
    factory = Factory(cls, params)
    kwargs: dict[str, Any] = {}
    for name, param in sig.parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        classes = params[name]
        if name in ("requires_safety_checker", "force_zeros_for_empty_prompt", "add_watermarker", "is_cosxl_edit"):
            kwargs[name] = False
            continue
        if name in ("safety_checker", "feature_extractor", "image_encoder"):
            kwargs[name] = None  # optional everywhere; the tests build a safety checker of their own
            continue
        try:
            kwargs[name] = factory.make(name, classes)
        except CannotBuild:
            if name in optional or param.default is None or "NoneType" in classes or "None" in classes:
                kwargs[name] = None
            elif param.default is not inspect.Parameter.empty:
                continue
            else:
                raise
    try:
        pipe = cls(**kwargs)
    except Exception as exc:
        raise CannotBuild(f"the components do not fit: {type(exc).__name__}: {str(exc)[:160]}") from exc
    pipe.set_progress_bar_config(disable=True)
    return pipe


def call_inputs(pipe: Any, seed: int, steps: list[int]) -> dict[str, Any]:
    p = __import__("_pipes")
    params = inspect.signature(type(pipe).__call__).parameters
    got: dict[str, Any] = {"num_inference_steps": STEPS, "generator": p.generator(seed)}
    if "prompt" in params:
        got["prompt"] = p.PROMPT
    if "output_type" in params:
        got["output_type"] = "pt"
    for key in ("height", "width"):
        if key in params:
            got[key] = 32
    for key in ("image", "control_image", "init_image"):
        if key in params:
            got[key] = p.init_image()
    if "mask_image" in params:
        got["mask_image"] = p.init_image()[:, :1]
    if "strength" in params:
        got["strength"] = 1.0
    if "_auto_resize" in params:
        got["_auto_resize"] = False  # Flux Kontext resizes its image to one of its own sizes, about 1024×1024
    if "max_area" in params:
        got["max_area"] = 32 * 32  # and its output to this area (1024×1024 by default)
    if "use_resolution_binning" in params:
        got["use_resolution_binning"] = False  # PixArt's own sizes are 256 and more
    if "max_sequence_length" in params:
        got["max_sequence_length"] = 16
    if "callback_on_step_end" in params:
        got["callback_on_step_end"] = lambda pipe, i, t, kw: steps.append(i) or {}
    return got


def _output(result: Any) -> Any:
    import torch

    found = result[0] if isinstance(result, tuple) else getattr(result, "images", None)
    if found is None:
        found = getattr(result, "frames", None) if not isinstance(result, tuple) else found
    if isinstance(found, torch.Tensor):
        return found
    return torch.as_tensor(found) if found is not None else None


def sweep_one(name: str) -> dict[str, Any]:
    """One class's row (in this process)."""
    try:
        return _sweep_one(name)
    except Exception as exc:  # anything the pipeline's own code raised after the calls
        return {"pipeline": name, "state": "not called", "why": f"{type(exc).__name__}: {str(exc)[:200]}"}


def _sweep_one(name: str) -> dict[str, Any]:
    import diffusers
    import torch

    import gpuprobe
    from gpuprobe.integrations.diffusers import instrument, uninstrument

    started = time.perf_counter()
    row: dict[str, Any] = {"pipeline": name}
    try:
        cls = getattr(diffusers, name)
        pipe = build(cls)
    except Exception as exc:  # CannotBuild, or the class cannot be imported here
        return {**row, "state": "not built", "why": f"{type(exc).__name__}: {str(exc)[:200]}"}
    plain_steps: list[int] = []
    try:
        plain = _output(pipe(**call_inputs(pipe, 0, plain_steps)))
    except Exception as exc:
        return {**row, "state": "not called", "why": f"{type(exc).__name__}: {str(exc)[:200]}"}
    gpuprobe.collect()
    steps: list[int] = []
    instrument(pipe, model_name=name)
    try:
        measured = _output(pipe(**call_inputs(pipe, 0, steps)))
    finally:
        uninstrument(pipe)
    seen = sum(p.count for md in gpuprobe.collect() if md.spec.name == "gpuprobe.diffusion.step.duration"
               for p in md.points if p.labels.get("model") == name and p.labels.get("clock") == "host")
    # The oracle: the steps the caller's callback saw; without a callback, the steps asked for (these pipelines
    # take no strength or other input that runs fewer).
    has_callback = "callback_on_step_end" in inspect.signature(type(pipe).__call__).parameters
    expected = len(steps) if has_callback else STEPS
    same = plain is not None and measured is not None and torch.equal(plain, measured)
    row.update(steps=seen, expected_steps=expected, oracle="callback" if has_callback else "num_inference_steps",
               same_output=same, seconds=round(time.perf_counter() - started, 2))
    if not same:
        return {**row, "state": "differs", "why": "the instrumented output differs from the plain one"}
    if seen != expected:
        seen_by = "the callback saw" if has_callback else "num_inference_steps is"
        return {**row, "state": "differs", "why": f"{seen} steps measured, {seen_by} {expected}"}
    return {**row, "state": "measured"}


def pipeline_names() -> list[str]:
    """The pipeline classes diffusers exports (modular pipelines and ONNX/Flax ones left out: no __call__ loop)."""
    import diffusers

    return sorted(n for n in dir(diffusers) if n.endswith("Pipeline") and n != "DiffusionPipeline"
                  and not n.startswith(("Auto", "Flax", "Onnx", "OnnxStable")) and "Modular" not in n)


def _worker() -> int:
    """Sweep the class named on each line of standard input; one JSON row per line on standard output."""
    out = sys.stdout
    sys.stdout = sys.stderr  # what pipelines print stays off the rows
    for line in sys.stdin:
        name = line.strip()
        if name:
            out.write(json.dumps(sweep_one(name)) + "\n")
            out.flush()
    return 0


class _Workers:
    """A worker process (restarted after a class that ran past the timeout) and its rows."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.proc: subprocess.Popen[str] | None = None
        self.rows: list[str] = []
        self.ready = threading.Event()

    def _start(self) -> subprocess.Popen[str]:
        # Isolated (-I: no PYTHON* variables, no user site, not the working folder on the path); this script
        # puts tests/diffusers on its path itself.
        proc = subprocess.Popen([sys.executable, "-I", __file__, "--worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=str(ROOT))

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.rows.append(line)
                self.ready.set()
            self.ready.set()

        threading.Thread(target=read, daemon=True).start()
        return proc

    def run(self, name: str) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        self.ready.clear()
        assert self.proc.stdin is not None
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        if self.ready.wait(self.timeout) and self.rows:
            return json.loads(self.rows.pop(0))
        self.close()
        return {"pipeline": name, "state": "not called", "why": f"took more than {self.timeout:g} s"}

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            self.rows.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, help="sweep this many classes, the same ones each run (seed 0)")
    parser.add_argument("--only", help="comma-separated class names")
    parser.add_argument("--json", action="store_true", help="one JSON object: the rows and the counts")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for one class (default 60)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        warnings.simplefilter("ignore")
        import torch

        torch.set_num_threads(1)
        return _worker()
    import diffusers  # noqa: F401 (the class names)

    names = pipeline_names()
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            print(f"diffusers_sweep: not a pipeline class of diffusers: {', '.join(unknown)}", file=sys.stderr)
            return 2
        names = wanted
    elif args.sample:
        names = sorted(random.Random(0).sample(names, min(args.sample, len(names))))
    rows = []
    workers = _Workers(args.timeout)
    try:
        for name in names:
            row = workers.run(name)
            rows.append(row)
            # With --json the rows go to standard output at the end; the progress to standard error.
            print(f"{row['state']:>10}  {name}  {row.get('why', '')}", file=sys.stderr if args.json else sys.stdout,
                  flush=True)
    finally:
        workers.close()
    counts = {state: sum(r["state"] == state for r in rows) for state in STATES}
    if args.json:
        print(json.dumps({"rows": rows, "counts": counts, "classes": len(rows)}))
    else:
        print(f"{len(rows)} classes: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return 1 if counts["differs"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
