"""The variants ``gpuprobe try`` measures, each with the exact code change it stands for, and which apply.

A variant is a few lines of Python run against two names, ``model`` (the model) and ``generate_kwargs``
(the keyword arguments of the baseline's ``model.generate(**generate_kwargs)``), with ``torch`` and
``transformers`` imported; it may also bind ``generate`` (the callable to use instead of
``model.generate``). The experiment applies variants by running exactly that code, so the code it
prints is the change it measured (:mod:`gpuprobe.experiment.apply`).

What applies is decided from the model's own attributes and the machine, read once in
:func:`model_facts` and :func:`machine_facts` (every reading of transformers' and torch's attributes is
there): a static cache where the model's cache can be one, every attention implementation the model
class declares and the machine has, the half dtypes the device supports, each logits processor or
stopping criterion the sync audit or the step components flag, and continuous batching for a batch of
requests.

Example:
    >>> from gpuprobe.experiment.variants import Variant
    >>> v = Variant("greedy-only", "greedy decoding", 'generate_kwargs["do_sample"] = False')
    >>> v.group
    'custom'
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["Variant", "NotRun", "ModelFacts", "Machine", "model_facts", "machine_facts", "GROUPS",
           "catalogue", "processor_variants", "wanted"]

# call: the code runs on a fresh copy of generate_kwargs before every call (switching the model, if it
# does, is undone after the call); copy: the code runs once on a private copy of the model
CALL, COPY = "call", "copy"

#: Groups ``--variants`` takes besides variant names, and what ``auto`` (the default) runs.
GROUPS = {
    "cache": ("static-cache", "static-cache+compile"),
    "compile": ("static-cache+compile",),
    "attention": ("attn:",),
    "dtype": ("dtype:",),
    "processors": ("no-logits-processor:", "no-stopping-criterion:"),
    "batching": ("continuous-batching",),
}

# Flags for a logits processor or stopping criterion: any sync per step, or this share of the step time.
FLAG_SHARE = 0.05


@dataclasses.dataclass(frozen=True)
class Variant:
    """One change to measure against the baseline.

    Attributes:
        name: short and stable (``static-cache``, ``attn:eager``, ``no-logits-processor:MyProcessor``).
        title: what it is, for people.
        code: the change, as Python run with ``model``, ``generate_kwargs``, ``torch`` and ``transformers``
            in scope; it may rebind ``model`` and ``generate_kwargs`` and bind ``generate``.
        group: ``cache``, ``compile``, ``attention``, ``dtype``, ``processors``, ``batching`` or ``custom``.
        scope: ``call`` (run before every call on a copy of the keyword arguments) or ``copy`` (run once, on
            a copy of the model: a dtype change).
        restore: code that puts a shared model back after a ``call`` variant changed it (not part of the
            change; empty when the code leaves the model alone).
    """

    name: str
    title: str
    code: str
    group: str = "custom"
    scope: str = CALL
    restore: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "title": self.title, "group": self.group, "code": self.code}


@dataclasses.dataclass(frozen=True)
class NotRun:
    """A variant that was not measured, and why (it does not apply, was not asked for, or time ran out)."""

    name: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "reason": self.reason}


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What the model class declares (read once; private attributes of transformers included)."""

    cls: str
    dtype: str
    attention: str | None
    attentions: tuple[str, ...]
    switch_attention: bool
    default_cache: bool
    static_cache: bool | None
    compile_fullgraph: bool
    generate_batch: bool
    max_positions: int | None


@dataclasses.dataclass(frozen=True)
class Machine:
    """The device the model runs on and what it has."""

    device: str
    cuda: bool
    name: str
    flash_attn: bool
    flex_attention: bool
    half_dtypes: tuple[str, ...]
    compile_on_cpu: bool

    @property
    def clock(self) -> str:
        return "device" if self.cuda else "host"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"clock": self.clock}


def model_facts(model: Any) -> ModelFacts:
    """Read the model class's capabilities through its own attributes."""
    cls = type(model)
    config = getattr(model, "config", None)
    attentions = ["eager"]
    if getattr(cls, "_supports_sdpa", False):
        attentions.append("sdpa")
    if getattr(cls, "_supports_flash_attn", False) or getattr(cls, "_supports_flash_attn_2", False):
        attentions.append("flash_attention_2")
    if getattr(cls, "_supports_flex_attn", False):
        attentions.append("flex_attention")
    default_cache = getattr(cls, "_supports_default_dynamic_cache", None)
    try:
        default = bool(default_cache()) if callable(default_cache) else True
    except Exception:
        default = False
    static = getattr(cls, "_supports_static_cache", None)  # releases before 5 declared it
    dtype = getattr(model, "dtype", None)
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return ModelFacts(
        cls=cls.__name__,
        dtype=str(dtype).replace("torch.", "") if dtype is not None else "unknown",
        attention=getattr(config, "_attn_implementation", None),
        attentions=tuple(attentions),
        switch_attention=callable(getattr(model, "set_attn_implementation", None)),
        default_cache=default and not getattr(config, "is_encoder_decoder", False),
        static_cache=None if static is None else bool(static),
        compile_fullgraph=bool(getattr(cls, "_can_compile_fullgraph", False)),
        generate_batch=callable(getattr(model, "generate_batch", None)),
        max_positions=int(positions) if isinstance(positions, int) else None,
    )


def machine_facts(model: Any) -> Machine:
    """The device of the model's parameters, and what that device supports."""
    import torch
    import transformers

    try:
        device = next(model.parameters()).device
    except (StopIteration, AttributeError, TypeError):
        device = torch.device("cpu")
    cuda = device.type == "cuda"
    if cuda:
        name = torch.cuda.get_device_name(device)
        halves = ("bfloat16", "float16") if torch.cuda.is_bf16_supported() else ("float16",)
    else:
        # bfloat16 matrix products run natively on a CPU; float16 ones are emulated there, no remedy
        name, halves = device.type.upper(), ("bfloat16",)
    compile_config = getattr(transformers, "CompileConfig", None)
    return Machine(
        device=str(device),
        cuda=cuda,
        name=name,
        flash_attn=cuda and importlib.util.find_spec("flash_attn") is not None,
        flex_attention=cuda and importlib.util.find_spec("torch.nn.attention.flex_attention") is not None,
        half_dtypes=halves,
        compile_on_cpu=compile_config is not None and hasattr(compile_config, "_compile_all_devices"),
    )


def _static(facts: ModelFacts, machine: Machine, kwargs: Mapping[str, Any]) -> Variant | NotRun:
    name = "static-cache"
    if kwargs.get("cache_implementation") == "static":
        return NotRun(name, "the baseline already uses a static cache (cache_implementation='static')")
    why = _no_static(facts)
    if why:
        return NotRun(name, why)
    code = 'generate_kwargs["cache_implementation"] = "static"'
    if machine.cuda:
        # on CUDA transformers compiles the forward of a static cache by itself: this variant is the cache alone
        code += '\ngenerate_kwargs["disable_compile"] = True'
    return Variant(name, "static KV cache (preallocated, written in place)", code, "cache")


def _no_static(facts: ModelFacts) -> str | None:
    if facts.static_cache is False:
        return f"{facts.cls} declares no static cache support (_supports_static_cache is False)"
    if not facts.default_cache:
        return f"{facts.cls} brings its own cache: generate() ignores cache_implementation"
    if facts.static_cache is None and not facts.compile_fullgraph:
        return f"{facts.cls} cannot run as one static graph (_can_compile_fullgraph is False): no static cache"
    return None


def _compiled(facts: ModelFacts, machine: Machine, kwargs: Mapping[str, Any], asked: bool) -> Variant | NotRun:
    name = "static-cache+compile"
    why = _no_static(facts)
    if why:
        return NotRun(name, why)
    if not facts.compile_fullgraph:
        return NotRun(name, f"{facts.cls} cannot compile as one graph (_can_compile_fullgraph is False)")
    code = ('generate_kwargs["cache_implementation"] = "static"\n'
            'generate_kwargs["compile_config"] = transformers.CompileConfig(mode="reduce-overhead")')
    if machine.cuda:
        return Variant(name, "static KV cache + torch.compile (CUDA graphs: mode='reduce-overhead')", code, "compile")
    if not asked:
        return NotRun(name, "torch.compile on a CPU takes minutes and CUDA graphs need a GPU: run it on the GPU, or "
                            "ask for it here with --variants static-cache+compile")
    if not machine.compile_on_cpu:
        return NotRun(name, "this transformers compiles generate()'s forward on accelerators only")
    code = ('generate_kwargs["cache_implementation"] = "static"\n'
            'generate_kwargs["compile_config"] = transformers.CompileConfig(mode="default")\n'
            'generate_kwargs["compile_config"]._compile_all_devices = True  # compile on a CPU too')
    return Variant(name, "static KV cache + torch.compile (inductor, on the CPU)", code, "compile")


def _attention(facts: ModelFacts, machine: Machine) -> list[Variant | NotRun]:
    out: list[Variant | NotRun] = []
    if len(facts.attentions) == 1:
        return [NotRun("attn:*", f"{facts.cls} declares one attention implementation only (eager)")]
    if not facts.switch_attention:
        return [NotRun("attn:*", "this model cannot switch attention implementations (no set_attn_implementation)")]
    for impl in facts.attentions:
        name = f"attn:{impl}"
        if impl == facts.attention:
            continue  # the baseline
        if impl == "flash_attention_2" and not machine.flash_attn:
            out.append(NotRun(name, "the flash_attn package is not installed" if machine.cuda else "needs CUDA"))
            continue
        if impl == "flex_attention" and not machine.cuda:
            out.append(NotRun(name, "FlexAttention runs compiled kernels on a GPU; not on a CPU"))
            continue
        out.append(Variant(name, f"attention: {impl} (baseline: {facts.attention})",
                           f'model.set_attn_implementation("{impl}")', "attention",
                           restore=f'model.set_attn_implementation("{facts.attention}")'))
    return out


def _dtypes(facts: ModelFacts, machine: Machine) -> list[Variant | NotRun]:
    out: list[Variant | NotRun] = []
    for dtype in machine.half_dtypes:
        if dtype == facts.dtype:
            continue
        out.append(Variant(f"dtype:{dtype}", f"weights and activations in {dtype} (baseline: {facts.dtype})",
                           f"model = model.to(torch.{dtype})", "dtype", scope=COPY))
    if machine.cuda and "float16" not in machine.half_dtypes:
        out.append(NotRun("dtype:float16", "this GPU has no float16 support"))
    if not machine.cuda and facts.dtype != "float16":
        out.append(NotRun("dtype:float16", "float16 matrix products are emulated on a CPU: measure it on a GPU"))
    return out


def _batching(facts: ModelFacts, machine: Machine, kwargs: Mapping[str, Any], batch: int, prompt_len: int,
              new_tokens: int, config_keys: Iterable[str]) -> Variant | NotRun:
    name = "continuous-batching"
    if batch < 2:
        return NotRun(name, "one request: continuous batching needs a batch of them (--batch-sizes 4)")
    if not facts.generate_batch:
        return NotRun(name, f"{facts.cls} has no generate_batch()")
    known = set(config_keys)
    others = sorted(k for k in kwargs if k not in ("input_ids", "attention_mask") and k not in known)
    if others:
        return NotRun(name, f"generate_batch() takes generation settings only; the baseline passes {', '.join(others)}")
    code = (
        "import copy\n"
        "generation_config = copy.deepcopy(model.generation_config)\n"
        'generation_config.update(**{k: v for k, v in generate_kwargs.items() if k not in ("input_ids", '
        '"attention_mask")})\n'
        'masks = generate_kwargs.get("attention_mask", torch.ones_like(generate_kwargs["input_ids"]))\n'
        "generate = model.generate_batch\n"
        'generate_kwargs = {"inputs": [ids[mask.bool()].tolist() for ids, mask in '
        'zip(generate_kwargs["input_ids"], masks)],\n'
        '                   "generation_config": generation_config'
    )
    if not machine.cuda:
        # sized to these requests: the default sizes the paged cache by free memory (~30 s a call on a CPU)
        page = 16
        blocks = batch * (math.ceil((prompt_len + new_tokens) / page) + 1)
        code += (',\n                   "continuous_batching_config": transformers.ContinuousBatchingConfig('
                 f"num_blocks={blocks}, page_size={page}, max_batch_tokens={max(64, min(batch * prompt_len, 1024))})")
    code += "}"
    return Variant(name, f"continuous batching: generate_batch() of the {batch} requests", code, "batching")


def processor_variants(kwargs: Mapping[str, Any], flags: Mapping[tuple[str, str], str], asked: Sequence[str]
                       ) -> list[Variant | NotRun]:
    """One variant per logits processor or stopping criterion of the baseline's own lists.

    Args:
        kwargs: the baseline's generate() keyword arguments.
        flags: ``(component, class name)`` → why it is flagged (syncs, or its share of the step).
        asked: what ``--variants`` named (a named variant runs unflagged).
    """
    out: list[Variant | NotRun] = []
    for key, component, prefix in (("logits_processor", "logits_processor", "no-logits-processor"),
                                   ("stopping_criteria", "stopping_criteria", "no-stopping-criterion")):
        items = kwargs.get(key) or []
        names = [type(p).__name__ for p in items]
        for cls in dict.fromkeys(names):
            name = f"{prefix}:{cls}"
            why = flags.get((component, cls))
            if why is None and name not in asked:
                out.append(NotRun(name, "not flagged: no syncs, under "
                                        f"{FLAG_SHARE * 100:.0f} % of the step (ask with --variants {name})"))
                continue
            kind = "LogitsProcessorList" if key == "logits_processor" else "StoppingCriteriaList"
            code = (f'generate_kwargs["{key}"] = transformers.{kind}(\n'
                    f'    [p for p in generate_kwargs["{key}"] if type(p).__name__ != "{cls}"])')
            title = f"without {cls}" + (f" ({why})" if why else "")
            out.append(Variant(name, title, code, "processors"))
    return out


def catalogue(model: Any, kwargs: Mapping[str, Any], *, batch: int, prompt_len: int, new_tokens: int,
              asked: Sequence[str] = (), facts: ModelFacts | None = None, machine: Machine | None = None,
              ) -> list[Variant | NotRun]:
    """Every built-in variant but the processors' (which need the baseline's audit), applicable or not."""
    facts = facts or model_facts(model)
    machine = machine or machine_facts(model)
    config = getattr(model, "generation_config", None)
    keys = [k for k in dir(config) if not k.startswith("_")] if config is not None else []
    out: list[Variant | NotRun] = [_static(facts, machine, kwargs),
                                   _compiled(facts, machine, kwargs, "static-cache+compile" in asked)]
    out += _attention(facts, machine)
    out += _dtypes(facts, machine)
    out.append(_batching(facts, machine, kwargs, batch, prompt_len, new_tokens, keys))
    return out


def wanted(name: str, group: str, asked: Sequence[str]) -> bool:
    """Whether ``--variants`` (``asked``; empty or ``auto``/``all``: every one that applies) selects a variant."""
    if not asked or "auto" in asked or "all" in asked:
        return True
    for item in asked:
        if item == name or item == group:
            return True
        if any(name.startswith(prefix) for prefix in GROUPS.get(item, ())):
            return True
    return False
