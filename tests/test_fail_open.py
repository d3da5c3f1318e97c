"""gpuprobe never changes what the program does: every seam into another library fails open.

One table over the registry of seams (``gpuprobe._seams``), derived from the code: every module of the
package is imported, so a seam declared anywhere is a row here, and a seam without a scenario fails
the table. For each seam, gpuprobe's own work inside it is made to raise while a real workload runs
through it (a tiny Llama's ``generate()`` in several modes, ``generate_batch`` with preemption, a CUDA
graph capture and a sync audit on the simulated CUDA, ``gpuprobe run``'s start-up hook, the
OpenTelemetry instrumentor, a model pickled and copied, chats with transformers serve in this process);
the workload's results must equal those of the same workload without gpuprobe, the seam must switch itself off (with the others of its group), say so in ``info()``, count
``gpuprobe.seam.disabled`` once and warn once.

The faults are injected with :func:`gpuprobe.testing.seam_fault` for seams built from the seam
template; the few seams whose guard is written out (for speed, or to hand on an argument wrapped) get a
fault in the function their guard calls (``BREAKERS``).
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import io
import pickle
import pkgutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import gpuprobe
from gpuprobe import _seams
from gpuprobe.testing import reset, seam_fault

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gpuprobe.integrations._transformers import generate as hf_generate  # noqa: E402
from gpuprobe.integrations._transformers.generate import timed as hf_timed  # noqa: E402
from gpuprobe.integrations import transformers as hf  # noqa: E402

from helpers import cpu_continuous_batching_cannot_pin  # noqa: E402

PACKAGE = Path(gpuprobe.__file__).resolve().parent


def _import_everything() -> None:
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="gpuprobe."):
        if info.name.startswith(("gpuprobe.report", "gpuprobe.dashboards")) or info.name.endswith(
                ("__main__", "sitecustomize")):
            continue  # offline tools and entry points: they declare no seam
        importlib.import_module(info.name)


_import_everything()
SEAMS = sorted(_seams.registry(), key=lambda s: s.name)


# -- the workloads -----------------------------------------------------------------------------------

def _tiny_llama() -> Any:
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
    assistant = _tiny_llama()
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
    model = _tiny_llama()
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


def _run_cuda_graph(instrumented: bool) -> list[Any]:
    from gpuprobe.testing.simcuda import simulated_cuda

    with simulated_cuda(devices=1) as sim:
        reset()  # the device clock (and its capture guard) is picked with the simulation in place
        try:
            torch.cuda.current_device()
            if not instrumented:
                gpuprobe.disable()
            x = torch.arange(6.0)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                sim.launch(1_000_000, "captured")
                y = x * 2
            graph.replay()
            sim.finish()
            return [y.tolist(), sim.stats.invalidated_captures]
        finally:
            gpuprobe.enable()


def _run_sync_audit(instrumented: bool) -> list[Any]:
    t = torch.arange(10.0)
    if not instrumented:
        return [t.sum().item(), t[t > 4].tolist()]
    with gpuprobe.probe("audited", sync_audit=True):
        return [t.sum().item(), t[t > 4].tolist()]


def _run_cache_concats(instrumented: bool) -> list[Any]:
    """generate() with a dynamic cache (its layers concatenate) and a static one, counted or not."""
    from gpuprobe.integrations._transformers.cache import ConcatCounter

    model = _tiny_llama()
    ids = torch.tensor([[5, 6, 7, 8]])

    def workload() -> list[Any]:
        return [model.generate(ids, max_new_tokens=4, do_sample=False).tolist(),
                model.generate(ids, max_new_tokens=4, do_sample=False, cache_implementation="static").tolist()]

    if not instrumented:
        return workload()
    with ConcatCounter():
        return workload()


def _run_bootstrap(instrumented: bool) -> list[Any]:
    from gpuprobe import _bootstrap

    if not instrumented:
        return [False]
    try:
        return [_bootstrap.switch_on({})]
    finally:
        hf.uninstrument_all()


def _run_otel(instrumented: bool) -> list[Any]:
    from opentelemetry.sdk.metrics import MeterProvider

    from gpuprobe.integrations.opentelemetry import GpuprobeInstrumentor

    if not instrumented:
        return [None]
    instrumentor = GpuprobeInstrumentor()
    try:
        instrumentor.instrument(meter_provider=MeterProvider())
        return [None]
    finally:
        instrumentor.uninstrument()


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


SCENARIOS: dict[str, Callable[..., list[Any]]] = {
    "generate": _run_generate,
    "pickle": _run_pickle,
    "generate_batch": _run_batch,
    "cuda_graph": _run_cuda_graph,
    "sync_audit": _run_sync_audit,
    "cache_concats": _run_cache_concats,
    "run": _run_bootstrap,
    "otel": _run_otel,
    "serve": _run_serve,
}
CLASS_WIDE = {"transformers.class.generate", "transformers.class.init_continuous_batching",
              "transformers.class.own_generate", "transformers.class.subclass"}


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a fault injected into gpuprobe")


def _break_stand_in(kind: str) -> Callable[[pytest.MonkeyPatch], None]:
    """The clock read inside a stand-in's __call__ raises there (and only there), for one kind of element."""
    import sys

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


def _break_audit(mp: pytest.MonkeyPatch) -> None:
    from gpuprobe import _sync_audit

    mp.setattr(_sync_audit.SyncAudit, "hit", _boom)


def _break_bootstrap(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(hf, "instrument_all", _boom)


def _break_otel(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(hf, "instrument_all", _boom)


def _break_submit(name: str) -> Callable[[pytest.MonkeyPatch], None]:
    """The wrapping of a submitted callable raises inside one of the inference thread's two seams (the
    guard of each reads its own seam, ``seam``)."""
    import sys

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


# Seams whose guard is written out (not built from the seam template): the fault goes where their guard calls.
BREAKERS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "transformers.generate.logits_processor": _break_stand_in("processor"),
    "transformers.generate.stopping_criterion": _break_stand_in("criterion"),
    "torch.sync_audit.kernels": _break_audit,
    "python.run_import_hook": _break_bootstrap,
    "opentelemetry.instrumentor": _break_otel,
    "transformers.serving.submit": _break_submit("transformers.serving.submit"),
    "transformers.serving.async_submit": _break_submit("transformers.serving.async_submit"),
}


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    reset()
    yield
    reset()


_baselines: dict[tuple[str, bool], list[Any]] = {}


def _baseline(scenario: str, cls_wide: bool) -> list[Any]:
    key = (scenario, cls_wide)
    if key not in _baselines:
        _baselines[key] = SCENARIOS[scenario](False)
    return _baselines[key]


def test_the_registry_lists_every_seam_with_a_scenario() -> None:
    names = {s.name for s in SEAMS}
    assert {"transformers.generate", "transformers.continuous_batching.generation_loop",
            "torch.cuda_graph.capture_begin", "torch.sync_audit.kernels"} <= names
    assert [s.name for s in SEAMS if s.scenario not in SCENARIOS] == []


@pytest.mark.parametrize("seam", SEAMS, ids=lambda s: s.name)
def test_a_failure_of_gpuprobe_inside_a_seam_leaves_the_results_and_switches_it_off(
        seam: _seams.Seam, monkeypatch: pytest.MonkeyPatch) -> None:
    cls_wide = seam.name in CLASS_WIDE
    expected = _baseline(seam.scenario, cls_wide)
    run = SCENARIOS[seam.scenario]
    kwargs = {"cls_wide": True} if cls_wide else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if seam.name in BREAKERS:
            BREAKERS[seam.name](monkeypatch)
            got = run(True, **kwargs)
        else:
            with seam_fault(seam.name):
                got = run(True, **kwargs)
    assert got == expected  # the program's results, as without gpuprobe
    assert not seam.on, f"{seam.name} was not reached by its scenario, or did not switch itself off"
    group = {s["seam"]: s["state"] for s in gpuprobe.info()["seams"] if _seams.seam(s["seam"]).group == seam.group}
    assert set(group.values()) == {"off"}
    mine = [w for w in caught if f"seam {seam.name} " in str(w.message) or "gpuprobe run:" in str(w.message)]
    if seam.name == "python.run_import_hook":  # said on stderr by the hook itself, not as a warning
        assert mine == []
    else:
        assert len(mine) == 1, [str(w.message) for w in caught]
        disabled = [p for d in gpuprobe.collect() if d.spec.name == "gpuprobe.seam.disabled" for p in d.points]
        assert [(p.labels["seam"], p.value) for p in disabled] == [(seam.name, 1)]


def _with_new_keyword(sig: inspect.Signature) -> inspect.Signature:
    """``sig`` with one more keyword-only parameter, ``new_keyword``, before any ``**kwargs``."""
    params = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    rest = [p for p in sig.parameters.values() if p.kind is p.VAR_KEYWORD]
    new = inspect.Parameter("new_keyword", inspect.Parameter.KEYWORD_ONLY, default="absent")
    return sig.replace(parameters=[*params, new, *rest])


@pytest.mark.parametrize("scenario", ["generate", "generate_batch"])
def test_a_seam_whose_original_gains_a_keyword_forwards_it(scenario: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """As transformers 5.24 did with _run_generation_loop(use_inference_mode=...): each method seam of a
    model passes a keyword it has never heard of to the original, which gets it, once."""
    model = _tiny_llama()
    calls: list[tuple[str, Any]] = []
    for ms in hf_generate.METHOD_SEAMS:
        original = _seams.unwrapped(type(model), ms.attribute)

        def changed(self: Any, *args: Any, _name: str = ms.attribute, _orig: Any = original,
                    new_keyword: Any = "absent", **kwargs: Any) -> Any:
            calls.append((_name, new_keyword))
            if new_keyword != "absent":
                return "the original's result"
            return _orig(self, *args, **kwargs)

        changed.__signature__ = _with_new_keyword(inspect.signature(original))  # type: ignore[attr-defined]
        monkeypatch.setattr(type(model), ms.attribute, changed)
    hf.instrument(model)
    try:
        for ms in hf_generate.METHOD_SEAMS:
            calls.clear()
            assert getattr(model, ms.attribute)(new_keyword=1) == "the original's result"
            assert calls == [(ms.attribute, 1)]
        # and the workload still runs through the changed methods, measured
        if scenario == "generate":
            model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3, do_sample=False)
        else:
            reason = cpu_continuous_batching_cannot_pin()
            if reason:
                pytest.skip(reason)
            gen = transformers.GenerationConfig(max_new_tokens=3, do_sample=False, eos_token_id=-1, pad_token_id=0)
            out = model.generate_batch([[5, 6, 7]], generation_config=gen)
            assert [len(o.generated_tokens) for o in out.values()] == [3]
        assert all(s["state"] == "on" for s in gpuprobe.info()["seams"] if s["seam"].startswith("transformers."))
    finally:
        hf.uninstrument(model)
    assert all(ms.attribute not in model.__dict__ for ms in hf_generate.METHOD_SEAMS)


def test_replacements_keep_the_originals_signature_and_uninstall_cleanly() -> None:
    model = _tiny_llama()
    before = {ms.attribute: model.__dict__.get(ms.attribute) for ms in hf_generate.METHOD_SEAMS}
    installs = {ms.attribute: ms.seam.installs for ms in hf_generate.METHOD_SEAMS}  # other models' too
    hf.instrument(model)
    hf.instrument(model)  # installs once
    try:
        for ms in hf_generate.METHOD_SEAMS:
            seamed = getattr(model, ms.attribute)
            assert _seams.is_replacement(seamed)
            original = _seams.unwrapped(type(model), ms.attribute).__get__(model)
            assert inspect.signature(seamed) == inspect.signature(original), ms.attribute
            assert ms.seam.installs == installs[ms.attribute] + 1
    finally:
        hf.uninstrument(model)
    assert {ms.attribute: model.__dict__.get(ms.attribute) for ms in hf_generate.METHOD_SEAMS} == before
    assert {ms.attribute: ms.seam.installs for ms in hf_generate.METHOD_SEAMS} == installs


def test_a_missing_method_is_refused_and_the_rest_still_measures(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shape check: a loop method with another signature leaves the loop's seams out (info() says
    why); generate() is still measured per call, and its tokens are those of the plain model."""
    model = _tiny_llama()
    ids = torch.tensor([[5, 6, 7]])
    expected = model.generate(ids, max_new_tokens=3, do_sample=False).tolist()

    original = type(model)._prefill

    def renamed(self: Any, token_ids: Any, generation_config: Any, model_kwargs: Any, *args: Any, **kw: Any) -> Any:
        return original(self, token_ids, generation_config, model_kwargs, *args, **kw)

    monkeypatch.setattr(type(model), "_prefill", renamed)
    with pytest.warns(RuntimeWarning, match=r"seam transformers\.generate\.prefill .* is not installed: .*input_ids"):
        hf.instrument(model)
    try:
        assert model.generate(ids, max_new_tokens=3, do_sample=False).tolist() == expected
    finally:
        hf.uninstrument(model)
    states = {s["seam"]: s for s in gpuprobe.info()["seams"]}
    assert states["transformers.generate.prefill"]["state"] == "refused"
    assert "input_ids" in states["transformers.generate.prefill"]["why"]
    assert states["transformers.generate.stop_check"]["state"] == "refused"
    durations = [p for d in gpuprobe.collect() if d.spec.name == "gen_ai.server.request.duration" for p in d.points]
    assert sum(p.count for p in durations) == 1
    steps = [p for d in gpuprobe.collect() if d.spec.name == "gpuprobe.step.duration" for p in d.points]
    assert sum(p.count for p in steps) == 0


# -- nothing is patched outside the registry ------------------------------------------------------------

# Where gpuprobe sets attributes of objects it does not own: only through the seam mechanism.
_PATCHING_CALLS = {"setattr", "delattr", "__setattr__", "__delattr__", "impl", "py_impl"}
_ALLOWED = {
    "gpuprobe/_seams.py",  # the mechanism itself
    "gpuprobe/testing/simcuda/install.py",  # the simulated CUDA (its install), a test double installed on purpose
    "gpuprobe/testing/simnvml.py",  # the simulated NVML: it fills a module of its own making
}


def _patching_sites(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in _PATCHING_CALLS:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {ast.unparse(node)[:80]}")
        elif isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
            for target in targets:
                # obj.__dict__[name] = ... / del obj.__dict__[name]
                if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute)
                        and target.value.attr == "__dict__"):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {ast.unparse(node)[:80]}")
    return found


# Known sites that set gpuprobe's own attributes, or the user's objects' attributes on their behalf.
_OWN = (
    "object.__setattr__(self",  # the stand-ins' own slots
    "setattr(self._gp_inner",  # a stand-in forwards an attribute set to the element it holds
    "setattr(self.__wrapped__",  # a probed callable object forwards an attribute set to the object it wraps
    # The sync audit's dispatcher kernels: the seam torch.sync_audit.kernels, whose guard is written out
    # (registering a kernel is torch's own API for it, not an attribute set).
    "gpuprobe/_sync_audit.py:",
)


def test_nothing_is_patched_outside_the_seam_mechanism() -> None:
    sites = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE.parent))
        if rel in _ALLOWED or rel.startswith(("gpuprobe/report/", "gpuprobe/dashboards/")):
            continue
        sites += [s for s in _patching_sites(path) if not any(own in s for own in _OWN)]
    assert sites == [], "patch other libraries only through gpuprobe._seams (declare a Seam):\n" + "\n".join(sites)
