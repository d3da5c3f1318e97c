"""What gpuprobe knows of transformers itself: the versions supported, shape checks, and every reading of
transformers' own objects (private names included), gathered here so a new release is checked in one place.

The seams' own shape checks (a method's parameters) are :meth:`gpuprobe._seams.Seam.check`; what is
here checks the objects around them. Nothing here imports transformers at import time.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Iterable
from typing import Any

from ... import _seams
from ..._placement import tensor_device
from ...errors import GpuprobeError, missing

__all__ = ["SUPPORTED_VERSIONS", "TESTED_VERSION", "UnsupportedVersionError", "UnsupportedModelError",
           "import_transformers", "parse_version", "check_version", "check_model", "fits", "input_device",
           "input_tokens", "input_width", "read_loop", "peer_finished", "steps_undone", "loop_rows", "speculative_method",
           "draft_length", "decoding_module", "model_output_cache", "cache_bytes", "concatenating_cache_layers",
           "model_names", "is_encoder_decoder", "device_map_devices", "block_class_names", "text_config_fields",
           "output_embeddings", "computes_all_logits", "stock_criteria_call",
           "continuous_batching_classes", "manager_parts", "processor_parts", "request_counts", "scheduled_rows",
           "running_ids", "waiting_arrivals", "prefix_sharing_on", "page_tokens", "stop_limits", "sampling_params",
           "max_new_tokens",
           "waiting_or_running", "output_fields", "output_ended",
           "request_statuses", "ends_with_eos", "paged_cache_geometry", "used_blocks", "processor_placement",
           "SERVE_SERVER_MODULE", "serve_server_module", "serve_inference_thread", "add_app_middleware"]

# -- versions and models ---------------------------------------------------------------------------

SUPPORTED_VERSIONS = ">=5.18,<6"
TESTED_VERSION = "5.24"
_MIN, _MAX = (5, 18), (6, 0)


class UnsupportedVersionError(GpuprobeError):
    """The installed transformers is outside the versions this integration supports."""

    __module__ = "gpuprobe.integrations.transformers"  # its public name (tracebacks, pickles)


class UnsupportedModelError(GpuprobeError, TypeError):
    """The object given is not a transformers model that can ``generate()``."""

    __module__ = "gpuprobe.integrations.transformers"  # its public name (tracebacks, pickles)


def import_transformers() -> Any:
    """The transformers module; a clear error naming the extra to install when it is missing."""
    try:
        import transformers
    except ImportError as exc:
        raise missing("transformers", "transformers") from exc
    return transformers


def parse_version(version: str) -> tuple[int, ...]:
    """``(major, minor)`` of a version string (``"5.24.0.dev0"`` -> ``(5, 24)``)."""
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def check_version() -> str:
    """Check the installed transformers version; returns it.

    Returns:
        The installed version string.

    Raises:
        UnsupportedVersionError: outside ``SUPPORTED_VERSIONS``; the message names both.
        MissingDependencyError: transformers is not installed.

    Example:
        >>> from gpuprobe.integrations.transformers import check_version
        >>> check_version().startswith("5.")
        True
    """
    version = str(import_transformers().__version__)
    if not (_MIN <= parse_version(version) < _MAX):
        raise UnsupportedVersionError(
            f"gpuprobe's transformers integration supports transformers {SUPPORTED_VERSIONS} "
            f"(tested with {TESTED_VERSION}); the installed version is {version}. "
            f"Install a supported version, e.g. pip install 'transformers{SUPPORTED_VERSIONS}'."
        )
    return version


def check_model(model: Any) -> Any:
    """Check that ``model`` is a transformers model instance that can generate; returns ``GenerationMixin``."""
    tr = import_transformers()
    check_version()
    mixin = tr.GenerationMixin
    if isinstance(model, type):
        raise UnsupportedModelError(
            f"instrument() takes a model instance, got the class {model.__qualname__}; "
            "use instrument_class() for every instance of a class"
        )
    if not isinstance(model, mixin) or not callable(getattr(model, "generate", None)):
        hint = ""
        if callable(getattr(model, "get_base_model", None)):  # a PEFT wrapper
            hint = "; for a PEFT model, instrument model.get_base_model()"
        raise UnsupportedModelError(
            "gpuprobe.integrations.transformers.instrument() needs a transformers model that can generate "
            "(a GenerationMixin subclass such as AutoModelForCausalLM or AutoModelForSeq2SeqLM); got "
            f"{type(model).__module__}.{type(model).__qualname__}{hint}"
        )
    can = getattr(model, "can_generate", None)
    if callable(can) and not can():
        raise UnsupportedModelError(
            f"{type(model).__qualname__} cannot generate (its can_generate() is False); "
            "instrument a model with a language-modeling head"
        )
    return mixin


def fits(obj: Any, seams: tuple[_seams.Seam, ...]) -> bool:
    """Whether ``obj`` has every method of ``seams`` with the parameters gpuprobe reads (the first
    mismatch is recorded on its seam: ``info()["seams"]``)."""
    if obj is None or not hasattr(obj, "__dict__"):
        for seam in seams:
            seam.refuse(f"the object that should have {seam.attribute} is missing or has no __dict__")
        return False
    return all(seam.check(obj) is None for seam in seams)


# -- a model's own description ----------------------------------------------------------------------

def model_names(model: Any) -> tuple[str, str]:
    """``(name_or_path, model_type)`` of a model's config (empty strings where it has none)."""
    cfg = getattr(model, "config", None)
    return str(getattr(cfg, "name_or_path", "") or ""), str(getattr(cfg, "model_type", "") or "")


def is_encoder_decoder(model: Any) -> bool:
    """Whether a model's config says it is an encoder-decoder."""
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


def device_map_devices(model: Any) -> set[int]:
    """The CUDA ordinals of a model's ``hf_device_map`` (``device_map="auto"``); empty without one."""
    device_map = getattr(model, "hf_device_map", None)
    if not isinstance(device_map, dict):
        return set()
    return {d for d in device_map.values() if isinstance(d, int) and not isinstance(d, bool)}


def block_class_names(model: Any) -> set[str]:
    """The class names of ``model._no_split_modules``: the blocks that must stay on one device."""
    return set(getattr(model, "_no_split_modules", None) or ())


_TEXT_CONFIG_FIELDS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                       "hidden_size", "sliding_window", "layer_types")


def text_config_fields(model: Any) -> dict[str, Any] | None:
    """The fields of a model's text config that size its steps (:data:`_TEXT_CONFIG_FIELDS`, None where
    missing), plus ``is_encoder_decoder``; None when the model has no config. A multimodal model's text
    config is its ``get_text_config()``."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    fields = {name: getattr(text, name, None) for name in _TEXT_CONFIG_FIELDS}
    fields["is_encoder_decoder"] = bool(getattr(config, "is_encoder_decoder", False))
    return fields


def output_embeddings(model: Any) -> Any:
    """The model's language-modeling head (``get_output_embeddings()``), or None."""
    get = getattr(model, "get_output_embeddings", None)
    return get() if callable(get) else None


def computes_all_logits(model: Any) -> bool:
    """Whether the model's forward computes logits at every position (no ``logits_to_keep``)."""
    import inspect

    supports = getattr(model, "_supports_logits_to_keep", None)
    if callable(supports):
        return not supports()
    try:
        return "logits_to_keep" not in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return True


def stock_criteria_call() -> Any:
    """``StoppingCriteriaList.__call__`` of the loaded transformers, or None (not imported yet)."""
    module = sys.modules.get("transformers.generation.stopping_criteria")
    cls = getattr(module, "StoppingCriteriaList", None)
    return getattr(cls, "__call__", None)


# -- generate(): its arguments, its loop, its outputs ------------------------------------------------

def input_device(inputs: Any, kwargs: dict[str, Any]) -> Any:
    """Where a generate() call's inputs live (``torch.device``), or None when no tensor is found.

    ``inputs``: what was passed as generate()'s ``inputs`` parameter (by position or keyword).
    """
    x = inputs
    if x is None:
        x = kwargs.get("input_ids")
        if x is None:
            x = kwargs.get("inputs_embeds")
    return tensor_device(x) if hasattr(x, "device") else None


def read_loop(frame: Any) -> tuple[Any, bool]:
    """What the decoding loop running in ``frame`` does with its steps' tokens: ``(deferred, synced)``.

    ``deferred``: the loop's ``DeferredStopCheck`` when it reads each step's tokens one step late, else
    None. transformers 5.x (``_sample``) keeps its stop check in the local ``stop_check``: a
    ``DeferredStopCheck`` (mps in 5.23 and 5.24; planned for CUDA) copies the stop flag and the tokens to
    the host without waiting and reads them in the next step. Anything else (beam search, assisted
    decoding, a loop without that local) reads each step's tokens in that step.

    ``synced``: the loop runs with ``synced_gpus`` (FSDP, DeepSpeed ZeRO-3): once this rank's sequences
    are done it goes on running forwards, selecting nothing, until every rank is done (see
    :func:`peer_finished`).
    """
    utils = sys.modules.get("transformers.generation.utils")
    deferred = getattr(utils, "DeferredStopCheck", None)
    try:
        # Why once per call, at the first check after the prefill: reading a frame's locals copies all of
        # _sample's (~40) into a dict, 6-13 us on the test CPU.
        local = frame.f_locals
        check = local.get("stop_check")
        synced = local.get("synced_gpus") is True
    except Exception:
        return None, False
    return (check if deferred is not None and isinstance(check, deferred) else None), synced


def peer_finished(frame: Any) -> bool:
    """Whether this rank's sequences are done in the ``synced_gpus`` decoding loop running in ``frame``
    (its local ``this_peer_finished``, a bool or a one-element tensor that the loop's own stop check
    has just read on the host)."""
    try:
        return bool(frame.f_locals.get("this_peer_finished"))
    except Exception:
        return False


def steps_undone(stop_check: Any) -> int:
    """Decoding steps a ``DeferredStopCheck`` undid when its loop ended (read after ``generate()`` returned).

    It runs one forward more than the sequences needed when it read the stop flag one step late
    (``stop_reported``); ``finish()`` then drops that step's token.
    """
    return 1 if getattr(stop_check, "stop_reported", False) is True else 0


def loop_rows(batch: int, generation_config: Any) -> tuple[int, int]:
    """``(prompts, sequences)`` of a decoding loop that runs ``batch`` rows: the prompts it continues and
    the sequences it returns. Beam search runs ``num_beams`` rows per prompt and returns
    ``num_return_sequences`` of them; the other loops return the rows they run (``generate()`` has
    already repeated each prompt ``num_return_sequences`` times).
    """
    beams = getattr(generation_config, "num_beams", None)
    if not isinstance(beams, int) or beams <= 1 or batch % beams:
        return batch, batch
    returned = getattr(generation_config, "num_return_sequences", None)
    returned = returned if isinstance(returned, int) and returned >= 1 else 1
    return batch // beams, batch // beams * returned


def stop_limits(generation_config: Any, prompt_len: int | None, kwargs: dict[str, Any] | None) -> tuple[int | None, bool]:
    """``(new tokens at most, another stop)`` of a decoding loop: its token limit (``max_new_tokens``, else
    ``max_length`` less the prompt), and whether anything but that limit and the end-of-sequence token
    may stop it (``stop_strings``, the caller's own ``stopping_criteria``)."""
    new = getattr(generation_config, "max_new_tokens", None)
    if not isinstance(new, int):
        total = getattr(generation_config, "max_length", None)
        new = total - prompt_len if isinstance(total, int) and prompt_len is not None else None
    other = bool(getattr(generation_config, "stop_strings", None)) or bool((kwargs or {}).get("stopping_criteria"))
    return new, other


def sampling_params(generation_config: Any) -> tuple[float | None, float | None, int | None]:
    """``(temperature, top_p, top_k)`` a decoding loop samples with; None for each when it does not sample
    (greedy decoding reads none of them), and for one left at a value that does nothing."""
    if getattr(generation_config, "do_sample", False) is not True:
        return None, None, None
    temperature = getattr(generation_config, "temperature", None)
    top_p = getattr(generation_config, "top_p", None)
    top_k = getattr(generation_config, "top_k", None)
    return (float(temperature) if isinstance(temperature, (int, float)) else None,
            float(top_p) if isinstance(top_p, (int, float)) and top_p < 1.0 else None,
            int(top_k) if isinstance(top_k, int) and top_k > 0 else None)


def max_new_tokens(state: Any) -> int | None:
    """The new tokens a continuous-batching request may make at most (its ``RequestState``)."""
    value = getattr(state, "max_new_tokens", None)
    return value if isinstance(value, int) else None


# transformers' candidate generators (generation/candidate_generator.py) -> the ``method`` label; the first
# class of a generator's MRO found here names it (EarlyExitCandidateGenerator is an AssistedCandidateGenerator).
_SPECULATIVE_METHODS = {
    "PromptLookupCandidateGenerator": "prompt_lookup",
    "EarlyExitCandidateGenerator": "early_exit",
    "MTPCandidateGenerator": "mtp",
    "DFlashTokenCandidateGenerator": "dflash",
    "AssistedCandidateGenerator": "draft_model",  # and its subclasses for other tokenizers (UAG, USD)
    "SinglePositionMultiTokenCandidateGenerator": "draft_model",
}
SPECULATIVE_METHODS = ("draft_model", "prompt_lookup", "early_exit", "mtp", "dflash", "other")
"""The values of the ``method`` attribute of the speculative-decoding metrics."""


def speculative_method(generator: Any) -> str:
    """The ``method`` label of a candidate generator: where its draft tokens come from."""
    for cls in type(generator).__mro__:
        found = _SPECULATIVE_METHODS.get(cls.__name__)
        if found is not None:
            return found
    return "other"


def draft_length(scores: Any) -> int | None:
    """Draft tokens a verification step checked, from the ``scores`` it hands the candidate generator's
    ``update_candidate_strategy``: the main model's logits at each draft position and one more
    (``(batch, draft tokens + 1, vocabulary)``)."""
    shape = getattr(scores, "shape", None)
    if shape is None or len(shape) != 3:
        return None
    return max(0, int(shape[1]) - 1)


def decoding_module(model: Any) -> Any:
    """The part of ``model`` that runs in a decoding step: ``get_decoder()`` of an encoder-decoder or a
    multimodal model (the text decoder; their encoders run once, before the first step), else the model."""
    import torch.nn as nn

    get = getattr(model, "get_decoder", None)
    if callable(get):
        try:
            found = get()
        except Exception:  # a model whose get_decoder() needs what it does not have
            found = None
        if isinstance(found, nn.Module) and found is not model:
            return found
    return model


def input_tokens(inputs: Any, kwargs: dict[str, Any]) -> int | None:
    """Prompt tokens of a generate() call from the shape of its token ids (padding included).

    ``inputs``: what was passed as generate()'s ``inputs`` parameter (by position or keyword).
    """
    x = inputs
    if x is None:
        x = kwargs.get("input_ids")
    if x is not None:
        shape = getattr(x, "shape", None)
        dtype = getattr(x, "dtype", None)
        if shape is not None and len(shape) == 2 and dtype is not None and not dtype.is_floating_point:
            return int(shape[0]) * int(shape[1])
        return None
    x = kwargs.get("inputs_embeds")
    shape = getattr(x, "shape", None)
    if shape is not None and len(shape) == 3:
        return int(shape[0]) * int(shape[1])
    return None


def input_width(inputs: Any, kwargs: dict[str, Any]) -> int | None:
    """Positions of a generate() call's prompt token ids (padding included), or None when it has none."""
    x = inputs if inputs is not None else kwargs.get("input_ids")
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    if shape is not None and len(shape) == 2 and dtype is not None and not dtype.is_floating_point:
        return int(shape[1])
    return None


def model_output_cache(outputs: Any) -> Any:
    """The KV cache a forward returned, read without side effects.

    transformers >= 5.24 names it ``cache`` and keeps ``past_key_values`` as a property that logs a
    deprecation warning; earlier 5.x name it ``past_key_values``. A model output is a dict of the
    fields that are set: read as a dict, neither name logs anything.
    """
    get = getattr(outputs, "get", None)
    if get is None:
        return None
    for key in ("cache", "past_key_values"):
        found = get(key)
        if found is not None:
            return found
    return None


def cache_bytes(cache: Any) -> int:
    """Bytes held by a transformers cache object: the sum of its tensors' ``nbytes`` (no sync)."""
    total = 0
    layers = getattr(cache, "layers", None)
    if layers is None:
        for sub in ("self_attention_cache", "cross_attention_cache"):
            inner = getattr(cache, sub, None)
            if inner is not None:
                total += cache_bytes(inner)
        return total
    for layer in layers:
        for attr in ("keys", "values"):
            t = getattr(layer, attr, None)
            if t is not None:
                total += t.nbytes
    return total


def concatenating_cache_layers() -> list[type]:
    """The cache layer classes whose ``update`` grows the cache by concatenation, each defining its own.

    transformers' dynamic cache keeps a ``DynamicLayer`` per decoder layer, and its ``update`` appends
    the new keys and values with ``torch.cat`` (a copy of the whole layer's cache, every step); so do the
    subclasses that replace ``update`` (the sliding window's, the quantized caches'). A static cache's
    layers write into a buffer made once and are not among them. Empty when transformers has no
    ``DynamicLayer`` (then nothing is counted).
    """
    cache_utils = importlib.import_module("transformers.cache_utils")
    base = getattr(cache_utils, "DynamicLayer", None)
    if not isinstance(base, type) or not callable(base.__dict__.get("update")):
        return []
    found = [base]
    for obj in vars(cache_utils).values():
        if isinstance(obj, type) and obj is not base and issubclass(obj, base) and callable(obj.__dict__.get("update")):
            found.append(obj)
    return found


# -- continuous batching ---------------------------------------------------------------------------

def continuous_batching_classes(names: Iterable[str]) -> dict[str, type]:
    """The classes of transformers' continuous-batching package named ``names``, by name; a class not
    found is left out.

    Imports every module of that package (a few seconds): the classes live in several of them, and
    which one has moved between releases.
    """
    import transformers.generation.continuous_batching as package

    for found in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        try:
            importlib.import_module(found.name)
        except Exception:  # a module that needs what is not installed (a kernel library): not ours to judge
            pass
    wanted = set(names)
    classes: dict[str, type] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == package.__name__ or name.startswith(package.__name__ + ".")):
            continue
        for owner in wanted:
            cls = getattr(module, owner, None)
            if isinstance(cls, type) and cls.__module__.startswith(package.__name__):
                classes.setdefault(owner, cls)
    return classes


def manager_parts(manager: Any) -> tuple[Any, Any]:
    """``(output router, batch processor)`` of a continuous-batching manager (None where missing: a
    processor exists only while a session runs)."""
    return getattr(manager, "output_router", None), getattr(manager, "batch_processor", None)


def processor_parts(bp: Any) -> tuple[Any, Any, Any]:
    """``(scheduler, paged cache, offloading manager)`` of a batch processor (None where missing)."""
    return getattr(bp, "scheduler", None), getattr(bp, "cache", None), getattr(bp, "offloading_manager", None)


def request_counts(scheduler: Any) -> tuple[int, int]:
    """``(running, waiting)`` requests of a scheduler."""
    return len(scheduler.active_requests), len(scheduler.waiting_requests)


def waiting_or_running(scheduler: Any, request_id: Any) -> Any:
    """The ``RequestState`` of a request the scheduler still holds, else None."""
    return scheduler.active_requests.get(request_id) or scheduler.waiting_requests.get(request_id)


def scheduled_rows(batch: Any) -> list[tuple[Any, Any, float, int, int, int, bool]]:
    """What a step reads of each request ``schedule_batch`` scheduled (its ``FutureRequestState``s), in
    one pass: ``(state, request_id, created_time, query_length, position_offset, prompt_length,
    has_new_token)``; ``position_offset`` has already moved past this step's tokens.

    Why one list and not one call per request: a step's reads stay one Python call, as when they were
    written in the loop.
    """
    return [(state, state.request_id, state.created_time, fs.query_length, state.position_offset,
             len(state.initial_tokens), fs.has_new_token) for fs in batch for state in (fs.state,)]


def running_ids(scheduler: Any) -> frozenset[Any]:
    """The ids of the requests a scheduler runs now."""
    return frozenset(scheduler.active_requests)


def waiting_arrivals(scheduler: Any) -> list[tuple[Any, float]]:
    """``(request_id, created_time)`` of each request waiting to be scheduled (``time.perf_counter()``)."""
    return [(rid, state.created_time) for rid, state in list(scheduler.waiting_requests.items())]


def page_tokens(cache: Any) -> int:
    """Tokens in one block of a paged cache (``ContinuousBatchingConfig.page_size``): a request of n tokens
    holds ceil(n / page) of the cache's whole-model blocks (``num_blocks`` counts those)."""
    pages = [int(a.tokens_per_page) for a in getattr(cache, "cache_allocators", {}).values()
             if getattr(a, "tokens_per_page", 0)]
    return min(pages) if pages else 0


def prefix_sharing_on(cache: Any) -> bool:
    """Whether a paged cache shares the blocks of a prompt's prefix among requests."""
    return bool(getattr(cache, "use_prefix_sharing", False))


def output_fields(output: Any) -> tuple[Any, float, int, Any, list[int], int]:
    """``(request_id, created_time, status, error, generated_tokens, prompt_length)`` of a request's
    last ``GenerationOutput``."""
    return (output.request_id, output.created_time, output.status, output.error, output.generated_tokens,
            len(output.prompt_ids))


def output_ended(output: Any, finished: int) -> bool:
    """Whether a delivered output is its request's last (status ``finished`` or after: failed)."""
    return bool(output.status >= finished)


def request_statuses() -> tuple[int, int]:
    """``(finished, failed)``: the values of transformers' ``RequestStatus`` that end a request."""
    from transformers.generation.continuous_batching.requests import RequestStatus

    return int(RequestStatus.FINISHED), int(RequestStatus.FAILED)


def ends_with_eos(state: Any, tokens: list[int]) -> bool:
    """Whether a request's ``tokens`` end with one of its ``RequestState``'s end-of-sequence ids."""
    if not tokens or state is None:
        return False
    eos = getattr(state, "eos_token_id", None)
    if eos is None:
        return False
    if isinstance(eos, int):
        return tokens[-1] == eos
    return tokens[-1] in eos


def paged_cache_geometry(cache: Any) -> tuple[list[tuple[int, int, Any]], int, int]:
    """What a paged cache's size is made of, read once per batch processor: ``(allocators, total bytes,
    blocks)``, each allocator as ``(pool index, bytes per block, ledger of prefix-cached blocks or None)``."""
    allocators = []
    for allocator in getattr(cache, "cache_allocators", {}).values():
        ledger = getattr(allocator, "ledger", None)
        allocators.append((allocator.index, allocator.bytes_per_block, ledger))
    return allocators, int(cache.num_sectors) * int(cache.bytes_per_sector), int(getattr(cache, "num_blocks", 0))


def used_blocks(cache: Any, allocators: list[tuple[int, int, Any]], total_bytes: int,
                num_blocks: int) -> tuple[int, float]:
    """Blocks in use and the fraction of the cache they hold (``allocators`` etc.: :func:`paged_cache_geometry`).
    Blocks kept only for prefix reuse (no request holds them; the scheduler evicts them when it needs
    room) count as free."""
    pool = cache.pool
    free = len(pool.free_sectors) * cache.bytes_per_sector
    for index, per_block, ledger in allocators:
        n = pool.count_free_blocks(index)
        if ledger is not None:
            n += len(ledger.cached_blocks)
        free += n * per_block
    used = 1.0 - free / total_bytes if total_bytes else 0.0
    used = min(1.0, max(0.0, used))
    return round(used * num_blocks), used


def processor_placement(bp: Any) -> tuple[int | None, Any]:
    """``(CUDA device, compute stream)`` of a continuous-batching processor; ``(None, None)`` off CUDA.

    Where the paged cache lives is where the model runs (transformers makes both on model.device);
    read through gpuprobe's one reader of tensor devices. The forward runs on the processor's compute
    stream (its events go there too).
    """
    cache_tensor = getattr(getattr(bp, "cache", None), "cache_tensor", None)
    device: Any = tensor_device(cache_tensor) if cache_tensor is not None else getattr(bp, "model_device", None)
    if getattr(device, "type", None) != "cuda":
        return None, None
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    return index, getattr(getattr(bp, "inputs_and_outputs", None), "compute_stream", None)


# -- transformers serve ----------------------------------------------------------------------------

SERVE_SERVER_MODULE = "transformers.cli.serving.server"
"""Where ``transformers serve`` builds its FastAPI app (``build_server``); imported by its CLI."""
_SERVE_UTILS_MODULE = "transformers.cli.serving.utils"


def serve_server_module() -> Any:
    """transformers serve's server module, if imported (None otherwise: nothing is imported here)."""
    return sys.modules.get(SERVE_SERVER_MODULE)


def serve_inference_thread() -> type | None:
    """``InferenceThread`` of transformers serve (the persistent thread plain ``generate()`` runs on),
    if its module is imported and has one."""
    utils = sys.modules.get(_SERVE_UTILS_MODULE)
    cls = getattr(utils, "InferenceThread", None)
    return cls if isinstance(cls, type) else None


def add_app_middleware(app: Any, middleware: type) -> None:
    """Add an ASGI middleware to the FastAPI app ``build_server`` returned, outside its own (Starlette's
    ``add_middleware``; the app must not have served a request yet)."""
    app.add_middleware(middleware)
