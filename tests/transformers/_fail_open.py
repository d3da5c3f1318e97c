"""The transformers integration's fail-open scenarios, run by tests/test_fail_open.py for every seam of it.

Its registry row names these scenarios (``Integration.scenarios``); each is ``run(instrumented, **keywords)``
returning what the program would see of a real workload on a tiny Llama built from a config (no
download): ``generate()`` in several modes, a model pickled and copied, ``generate_batch`` with
preemption, a dynamic cache's concatenations counted, chats with transformers serve in this process.
:data:`KEYWORDS` names the seams run with class-wide instrumentation; :data:`BREAKERS` the seams whose
guard is written out (the fault goes into the function their guard calls).
"""

from __future__ import annotations

import copy
import io
import pickle
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers

from gpuprobe import _seams
from gpuprobe.integrations import transformers as hf
from gpuprobe.integrations._transformers.generate import timed as hf_timed

from helpers import cpu_continuous_batching_cannot_pin


def tiny_llama() -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=256, pad_token_id=0, eos_token_id=1)
    return transformers.LlamaForCausalLM(config).eval()


class _Collect(transformers.generation.streamers.BaseStreamer):
    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def put(self, value: Any) -> None:
        self.seen.append(value.reshape(-1).tolist())

    def end(self) -> None:
        self.seen.append([])


class _Halve(transformers.LogitsProcessor):
    def __call__(self, input_ids: Any, scores: Any) -> Any:
        return scores / 2


class _Never(transformers.StoppingCriteria):
    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def _generate_workload(model: Any) -> list[Any]:
    """generate() greedy with processors, criteria and a streamer; sampling; beam search; a static
    cache with a compiled forward (eager backend: get_compiled_call is reached on the CPU)."""
    ids = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 13, 14]])
    out: list[Any] = []
    streamer = _Collect()
    out.append(model.generate(ids, max_new_tokens=6, do_sample=False, repetition_penalty=1.3,
                              logits_processor=transformers.LogitsProcessorList([_Halve()]),
                              stopping_criteria=transformers.StoppingCriteriaList([_Never()]),
                              streamer=streamer if ids.shape[0] == 1 else None).tolist())
    one = ids[:1]
    out.append(model.generate(one, max_new_tokens=5, do_sample=False, streamer=streamer).tolist())
    out.append(streamer.seen)
    torch.manual_seed(1)
    out.append(model.generate(ids, max_new_tokens=5, do_sample=True, top_k=8, temperature=0.7).tolist())
    out.append(model.generate(ids, max_new_tokens=4, num_beams=2, do_sample=False).tolist())
    compile_config = transformers.CompileConfig(backend="eager", fullgraph=False)
    compile_config._compile_all_devices = True  # transformers compiles on CUDA only unless told
    out.append(model.generate(one, max_new_tokens=3, do_sample=False, cache_implementation="static",
                              compile_config=compile_config).tolist())
    # Speculative decoding: a draft model (the same weights: its drafts are accepted) and prompt lookup.
    assistant = tiny_llama()
    out.append(model.generate(one, max_new_tokens=6, do_sample=False, assistant_model=assistant).tolist())
    out.append(model.generate(ids[:1], max_new_tokens=6, do_sample=False, prompt_lookup_num_tokens=2).tolist())

    class OwnGenerate(type(model)):  # a model class with a generate() of its own, defined now (as Whisper's)
        def generate(self, *args: Any, **kwargs: Any) -> Any:
            return super().generate(*args, **kwargs)[:, 1:]

    own = OwnGenerate(model.config).eval()
    own.load_state_dict(model.state_dict())
    out.append(own.generate(one, max_new_tokens=3, do_sample=False).tolist())
    return out


def _pickle_workload(model: Any) -> list[Any]:
    """After a generate() call, the model pickled, saved with torch.save, deep- and shallow-copied: each
    copy generates."""
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    out = [model.generate(ids, max_new_tokens=4, do_sample=False).tolist()]
    saved = io.BytesIO()
    torch.save(model, saved)
    saved.seek(0)
    for other in (pickle.loads(pickle.dumps(model)), torch.load(saved, weights_only=False), copy.deepcopy(model),
                  copy.copy(model)):
        out.append(other.generate(ids, max_new_tokens=4, do_sample=False).tolist())
    return out


def _batch_workload(model: Any) -> list[Any]:
    """generate_batch with more requests than the paged cache holds (preemption), and a cancelled request."""
    gen = transformers.GenerationConfig(max_new_tokens=24, do_sample=False, eos_token_id=-1, pad_token_id=0)
    tight = transformers.ContinuousBatchingConfig(num_blocks=8, page_size=16, max_batch_tokens=16)
    prompts = [[3 + (i * 7 + j) % 120 for j in range(10)] for i in range(6)]
    out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=tight)
    results: list[Any] = [[(o.prompt_ids, o.generated_tokens, o.error) for o in
                           sorted(out.values(), key=lambda o: o.prompt_ids)]]
    # A token id past the vocabulary: the forward raises and each request is delivered failed, one by one.
    failed = model.generate_batch([[5, 6, 7], [500, 6, 7]], generation_config=gen,
                                  continuous_batching_config=tight)
    results.append(sorted((o.prompt_ids, o.generated_tokens, o.error is not None) for o in failed.values()))
    roomy = transformers.ContinuousBatchingConfig(num_blocks=64, page_size=16, max_batch_tokens=64)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=roomy)
    manager.start()
    try:
        kept = manager.add_request([5, 6, 7], max_new_tokens=6)
        gone = manager.add_request([8, 9, 10, 11], max_new_tokens=200)
        manager.cancel_request(gone)
        result = manager.get_result(request_id=kept, timeout=60)
        results.append(result.generated_tokens if result is not None else None)
    finally:
        manager.stop(block=True, timeout=60)
    return results


def _run_model(workload: Callable[[Any], list[Any]], instrumented: bool, cls_wide: bool) -> list[Any]:
    """``workload`` on a fresh tiny Llama: plain, instrumented, or instrumented class-wide."""
    model = tiny_llama()
    if not instrumented:
        return workload(model)
    if cls_wide:
        hf.instrument_class(type(model))
        try:
            return workload(model)
        finally:
            hf.uninstrument_class(type(model))
    hf.instrument(model)
    try:
        return workload(model)
    finally:
        hf.uninstrument(model)


def _run_generate(instrumented: bool, cls_wide: bool = False) -> list[Any]:
    return _run_model(_generate_workload, instrumented, cls_wide)


def _run_pickle(instrumented: bool, cls_wide: bool = False) -> list[Any]:
    return _run_model(_pickle_workload, instrumented, cls_wide)


def _run_batch(instrumented: bool, cls_wide: bool = False) -> list[Any]:
    reason = cpu_continuous_batching_cannot_pin()
    if reason:
        pytest.skip(reason)
    return _run_model(_batch_workload, instrumented, cls_wide)


def _run_cache_concats(instrumented: bool) -> list[Any]:
    """generate() with a dynamic cache (its layers concatenate) and a static one, counted or not."""
    from gpuprobe.integrations._transformers.cache import ConcatCounter

    model = tiny_llama()
    ids = torch.tensor([[5, 6, 7, 8]])

    def workload() -> list[Any]:
        return [model.generate(ids, max_new_tokens=4, do_sample=False).tolist(),
                model.generate(ids, max_new_tokens=4, do_sample=False, cache_implementation="static").tolist()]

    if not instrumented:
        return workload()
    with ConcatCounter():
        return workload()


def _run_serve(instrumented: bool) -> list[Any]:
    """transformers serve in this process (plain generate()): a streamed and a whole chat completion with a
    client's id, and a whole one without; what the client reads of each."""
    for needed in ("fastapi", "uvicorn", "accelerate"):
        pytest.importorskip(needed)
    from _serve_app import serving

    if instrumented:
        hf.instrument_all()
    try:
        with serving() as server:
            answers = [server.chat(stream=True, request_id="client-stream"), server.chat(request_id="client-whole"),
                       server.chat()]
    finally:
        if instrumented:
            hf.uninstrument_all()
    streamed, whole, anonymous = answers
    out: list[Any] = [streamed.status, streamed.header("x-request-id"), streamed.streamed_text()]
    for answer in (whole, anonymous):
        body = answer.json()
        out += [answer.status, body["choices"][0]["message"]["content"], body["usage"], body["id"] ==
                answer.header("x-request-id")]
    return out + [whole.header("x-request-id"), len(anonymous.header("x-request-id") or "")]


def _break_stand_in(kind: str) -> Callable[[pytest.MonkeyPatch], None]:
    """The clock read inside a stand-in's __call__ raises there (and only there), for one kind of element."""
    code = hf_timed.Timed.__call__.__code__  # every stand-in class runs a copy of this code object
    clock = hf_timed.perf_counter_ns

    def breaker(mp: pytest.MonkeyPatch) -> None:
        def perf_counter_ns() -> int:
            caller = sys._getframe(1)
            if caller.f_code is code and (caller.f_locals["self"]._gp_child is None) == (kind == "criterion"):
                raise RuntimeError("a fault injected into gpuprobe")
            return clock()

        mp.setattr(hf_timed, "perf_counter_ns", perf_counter_ns)
    return breaker


def _break_submit(name: str) -> Callable[[pytest.MonkeyPatch], None]:
    """The wrapping of a submitted callable raises inside one of the inference thread's two seams (the
    guard of each reads its own seam, ``seam``)."""
    from gpuprobe.integrations._transformers import serve_app

    def breaker(mp: pytest.MonkeyPatch) -> None:
        target = _seams.seam(name)
        real = serve_app.in_request_context

        def in_request_context(fn: Any) -> Any:
            if sys._getframe(1).f_locals.get("seam") is target:
                raise RuntimeError("a fault injected into gpuprobe")
            return real(fn)

        mp.setattr(serve_app, "in_request_context", in_request_context)
    return breaker


SCENARIOS: dict[str, Callable[..., list[Any]]] = {
    "generate": _run_generate,
    "pickle": _run_pickle,
    "generate_batch": _run_batch,
    "cache_concats": _run_cache_concats,
    "serve": _run_serve,
}
"""The scenarios of the seams this integration declares, by name."""

_CLASS_WIDE = {"cls_wide": True}
KEYWORDS: dict[str, dict[str, Any]] = {
    "transformers.class.generate": _CLASS_WIDE,
    "transformers.class.init_continuous_batching": _CLASS_WIDE,
    "transformers.class.own_generate": _CLASS_WIDE,
    "transformers.class.subclass": _CLASS_WIDE,
}
"""Seams reached only under class-wide instrumentation: their scenario runs with these keywords."""

BREAKERS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "transformers.generate.logits_processor": _break_stand_in("processor"),
    "transformers.generate.stopping_criterion": _break_stand_in("criterion"),
    "transformers.serving.submit": _break_submit("transformers.serving.submit"),
    "transformers.serving.async_submit": _break_submit("transformers.serving.async_submit"),
}
"""Seams whose guard is written out (not built from the seam template): the fault goes where their guard calls."""
