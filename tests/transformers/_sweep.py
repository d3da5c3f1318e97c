"""The architecture sweep: transformers' architectures built from small configs, each generating in every mode,
plain and instrumented, with the instrumented run's counts checked against what the plain run did.

Used by ``tests/transformers/test_architecture_sweep.py`` (a sample, in CI) and by
``scripts/generation_sweep.py`` (every architecture, a result table).

For each architecture and mode the same call runs twice: uninstrumented (with a forward pre-hook of the
test's own counting the main model's forwards, and, for speculative modes, a wrapper of the test's own
recording what transformers hands its candidate generator), then instrumented. Checked:

- the outputs (tokens, and what a streamer received) are identical, or both runs raise the same error
  (then the mode is *unsupported* by that architecture, and the failed call is counted with ``error.type``);
- one request; input tokens (the prompt's shape); output tokens = the sequences returned × the new tokens
  asked for (``min_new_tokens = max_new_tokens``, so no sequence ends early);
- one prefill step, one decode step per further forward of the main model; one TTFT; one inter-token
  sample per output token after the first;
- speculative modes: drafts, draft tokens, accepted tokens and steps as transformers' own loop saw them.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
import transformers

import gpuprobe
from _hfkit import Watched, watch
from gpuprobe.integrations.transformers import instrument, instrument_all, uninstrument, uninstrument_all
from gpuprobe.testing import reset

t = transformers
NEW = 4  # new tokens per call
MODES = ("greedy", "sampling", "beam", "processors", "streamer", "static_cache", "assisted", "prompt_lookup",
         "batch2_padding", "instrument_all")

_SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=8, vocab_size=128, max_position_embeddings=128, d_model=32, d_ff=64, d_kv=8, num_layers=2,
              num_heads=4, n_embd=32, n_layer=2, n_head=4, n_positions=128, n_ctx=128, encoder_layers=2,
              decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
              decoder_ffn_dim=64, ffn_dim=64, num_decoder_layers=2, num_experts=4, num_local_experts=4,
              num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32, state_size=8,
              expand=2, time_step_rank=4, conv_kernel=4, rotary_dim=8, partial_rotary_factor=0.5,
              pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, sliding_window=64)


def small(model_type: str, **overrides: Any) -> Any:
    """``model_type``'s config with every size it has made small (and the special token ids 0, 1, 2)."""
    known = t.AutoConfig.for_model(model_type).to_dict()
    kwargs = {k: v for k, v in _SIZES.items() if k in known}
    kwargs.update(overrides)
    return t.AutoConfig.for_model(model_type, **kwargs)


def _causal(model_type: str, **overrides: Any) -> Callable[[], Any]:
    return lambda: t.AutoModelForCausalLM.from_config(small(model_type, **overrides))


def _seq2seq(model_type: str, **overrides: Any) -> Callable[[], Any]:
    return lambda: t.AutoModelForSeq2SeqLM.from_config(small(model_type, **overrides))


_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
               patch_size=8, projection_dim=32)


def _llava() -> Any:
    return t.LlavaForConditionalGeneration(t.LlavaConfig(
        text_config=small("llama").to_dict(), vision_config=dict(model_type="clip_vision_model", **_VISION),
        image_token_id=127))


def _paligemma() -> Any:
    return t.PaliGemmaForConditionalGeneration(t.PaliGemmaConfig(
        text_config=dict(small("gemma").to_dict(), model_type="gemma"),
        vision_config=dict(model_type="siglip_vision_model", **_VISION), image_token_index=127, projection_dim=32,
        vocab_size=128))


def _gemma3() -> Any:
    return t.Gemma3ForConditionalGeneration(t.Gemma3Config(
        text_config=small("gemma3_text").to_dict(), vision_config=dict(model_type="siglip_vision_model", **_VISION),
        image_token_index=127, mm_tokens_per_image=4))


def _mllama() -> Any:
    return t.MllamaForConditionalGeneration(t.MllamaConfig(
        text_config=dict(small("llama").to_dict(), model_type="mllama_text_model", cross_attention_layers=[1]),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_global_layers=1,
                           attention_heads=4, image_size=32, patch_size=8, vision_output_dim=64,
                           intermediate_layers_indices=[0]), image_token_index=127))


def _qwen2_vl() -> Any:
    text = dict(small("qwen2").to_dict(), model_type="qwen2_vl_text",
                rope_parameters=dict(rope_type="default", mrope_section=[1, 1, 2]))
    vision = dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4, mlp_ratio=2, in_chans=3, patch_size=8,
                  spatial_merge_size=2, temporal_patch_size=2)
    return t.Qwen2VLForConditionalGeneration(t.Qwen2VLConfig(text_config=text, vision_config=vision,
                                                             image_token_id=127, video_token_id=126,
                                                             vision_start_token_id=125))


def _whisper() -> Any:
    return t.WhisperForConditionalGeneration(t.WhisperConfig(
        vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=32,
        max_target_positions=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=3,
        suppress_tokens=None, begin_suppress_tokens=None))


def _speech_to_text() -> Any:
    return t.Speech2TextForConditionalGeneration(t.Speech2TextConfig(
        vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, input_feat_per_channel=16,
        input_channels=1, conv_channels=32, max_source_positions=64, max_target_positions=64, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, decoder_start_token_id=1))


def _moonshine() -> Any:
    return t.MoonshineForConditionalGeneration(t.MoonshineConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, encoder_num_hidden_layers=2,
        decoder_num_hidden_layers=2, encoder_num_attention_heads=4, decoder_num_attention_heads=4,
        max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1))


def _musicgen() -> Any:
    model = t.MusicgenForCausalLM(t.MusicgenDecoderConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64, num_codebooks=2,
        max_position_embeddings=64, pad_token_id=0, bos_token_id=1))
    model.generation_config = t.GenerationConfig(pad_token_id=0, bos_token_id=1, decoder_start_token_id=1)
    return model


@dataclasses.dataclass(frozen=True)
class Arch:
    """One architecture of the sweep."""

    name: str
    category: str  # dense | moe | ssm/hybrid | encoder-decoder | speech | vision-language
    build: Callable[[], Any]
    inputs: str = "ids"  # ids (token ids) | encoder (encoder token ids) | features (audio) | waveform | codebooks


ARCHS: tuple[Arch, ...] = (
    *(Arch(n, "dense", _causal(n)) for n in (
        "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi", "phi3", "falcon", "gpt2",
        "gpt_neox", "gptj", "opt", "bloom", "olmo", "olmo2", "starcoder2", "stablelm", "cohere", "granite",
        "codegen", "gpt_bigcode")),
    *(Arch(n, "moe", _causal(n)) for n in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe")),
    Arch("mamba", "ssm/hybrid", _causal("mamba")),
    Arch("mamba2", "ssm/hybrid", _causal("mamba2", num_heads=8, head_dim=8, n_groups=1)),
    Arch("falcon_mamba", "ssm/hybrid", _causal("falcon_mamba")),
    Arch("jamba", "ssm/hybrid", _causal("jamba", attn_layer_offset=1, attn_layer_period=2, expert_layer_period=2,
                                        expert_layer_offset=1, mamba_d_state=8, mamba_dt_rank=4,
                                        use_mamba_kernels=False)),
    Arch("recurrent_gemma", "ssm/hybrid", _causal("recurrent_gemma", block_types=["recurrent", "attention"],
                                                  lru_width=32, attention_window_size=16)),
    Arch("bamba", "ssm/hybrid", _causal("bamba", mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=1, mamba_d_state=8,
                                        attn_layer_indices=[1])),
    Arch("lfm2", "ssm/hybrid", _causal("lfm2", layer_types=["conv", "full_attention"])),
    Arch("qwen3_next", "ssm/hybrid", _causal("qwen3_next", layer_types=["linear_attention", "full_attention"],
                                             linear_num_key_heads=2, linear_num_value_heads=4,
                                             linear_key_head_dim=8, linear_value_head_dim=8)),
    *(Arch(n, "encoder-decoder", _seq2seq(n), "encoder") for n in (
        "bart", "mbart", "pegasus", "marian", "blenderbot", "prophetnet", "led", "mt5")),
    Arch("t5", "encoder-decoder", _seq2seq("t5", decoder_start_token_id=0), "encoder"),
    Arch("whisper", "speech", _whisper, "features"),
    Arch("speech_to_text", "speech", _speech_to_text, "speech_features"),
    Arch("moonshine", "speech", _moonshine, "waveform"),
    Arch("musicgen", "speech", _musicgen, "codebooks"),
    Arch("llava", "vision-language", _llava),
    Arch("paligemma", "vision-language", _paligemma),
    Arch("gemma3", "vision-language", _gemma3),
    Arch("mllama", "vision-language", _mllama),
    Arch("qwen2_vl", "vision-language", _qwen2_vl),
)
BY_NAME = {a.name: a for a in ARCHS}


@dataclasses.dataclass
class Call:
    """One generate() call of a mode: its inputs and keywords, and what it should count."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    input_tokens: int | None  # None: not token ids (features): not checked
    rows: int  # sequences returned
    streamer: Any = None
    prepare: Callable[[], None] | None = None  # puts back what a call changes (a draft model's draft length)


class _Recorder(t.generation.streamers.BaseStreamer):
    def __init__(self) -> None:
        self.chunks: list[list[int]] = []

    def put(self, value: Any) -> None:
        self.chunks.append(value.flatten().tolist())

    def end(self) -> None:
        self.chunks.append([])


class _Halve(t.LogitsProcessor):
    def __call__(self, input_ids: Any, scores: Any) -> Any:
        return scores / 2


def _inputs(arch: Arch, batch: int, model: Any) -> tuple[Any, dict[str, Any], int | None, int]:
    """(inputs, extra keywords, input tokens, rows per prompt) of a call with ``batch`` prompts."""
    g = torch.Generator().manual_seed(batch)
    if arch.inputs == "features":
        return torch.randn(batch, 16, 64, generator=g), {}, None, 1
    if arch.inputs == "speech_features":
        return torch.randn(batch, 20, 16, generator=g), {}, None, 1
    if arch.inputs == "waveform":
        return torch.randn(batch, 2000, generator=g), {}, None, 1
    if arch.inputs == "codebooks":
        books = model.config.num_codebooks
        ids = torch.randint(3, 60, (batch * books, 3), generator=g)
        return ids, {"num_return_sequences": 1}, ids.numel(), books
    ids = torch.randint(3, 100, (batch, 6), generator=g)
    if arch.inputs == "ids" and batch == 1 and arch.name != "musicgen":
        ids = torch.cat([ids[:, :3], ids[:, :3]], dim=1)  # n-grams repeat: prompt lookup finds drafts
    return ids, {}, ids.numel(), 1


def call_of(arch: Arch, mode: str, model: Any, assistant: Any) -> Call:
    batch = 2 if mode == "batch2_padding" else 1
    x, extra, n_in, rows = _inputs(arch, batch, model)
    kw: dict[str, Any] = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, **extra)
    streamer = None
    if mode == "sampling":
        kw.update(do_sample=True, top_k=20, temperature=0.8)
    elif mode == "beam":
        kw.update(num_beams=2, num_return_sequences=2)
        rows *= 2
    elif mode == "processors":
        kw.update(repetition_penalty=1.3, logits_processor=t.LogitsProcessorList([_Halve()]))
    elif mode == "streamer":
        streamer = _Recorder()
        kw["streamer"] = streamer
    elif mode == "static_cache":
        kw["cache_implementation"] = "static"
    elif mode == "assisted":
        kw["assistant_model"] = assistant
        # transformers keeps the draft length its heuristic reached in the draft model's generation config:
        # both runs start from the same one.
        config = copy.deepcopy(assistant.generation_config)

        def prepare() -> None:
            assistant.generation_config = copy.deepcopy(config)
    elif mode == "prompt_lookup":
        kw["prompt_lookup_num_tokens"] = 2
    elif mode == "batch2_padding" and arch.inputs in ("ids", "encoder"):
        mask = torch.ones_like(x)
        if arch.inputs == "ids":
            mask[0, :2] = 0  # left padding
        else:
            mask[0, -2:] = 0
        kw["attention_mask"] = mask
    return Call((x,), kw, n_in, rows * batch, streamer, prepare if mode == "assisted" else None)


def _run_plain(model: Any, call: Call, seed: int) -> tuple[Any, Watched]:
    with watch(model) as plain:
        return _outcome(model, call, seed), plain


def _outcome(model: Any, call: Call, seed: int) -> Any:
    if call.prepare is not None:
        call.prepare()
    torch.manual_seed(seed)
    if call.streamer is not None:
        call.streamer.chunks.clear()
    try:
        out = model.generate(*call.args, **call.kwargs)
    except Exception as exc:
        return ("raised", type(exc).__name__, str(exc)[:300])
    chunks = list(call.streamer.chunks) if call.streamer is not None else None
    return ("returned", out.tolist() if hasattr(out, "tolist") else repr(out), chunks)


def _counts(metric: str, **labels: str) -> float:
    return sum(p.count if md.spec.instrument == "histogram" else p.value for md in gpuprobe.collect()
               if md.spec.name == metric for p in md.points if all(p.labels.get(k) == v for k, v in labels.items()))


def _sums(metric: str, **labels: str) -> float:
    return sum(p.sum for md in gpuprobe.collect() if md.spec.name == metric
               for p in md.points if all(p.labels.get(k) == v for k, v in labels.items()))


@dataclasses.dataclass
class Result:
    arch: str
    mode: str
    status: str  # ok | unsupported | FAILED
    detail: str = ""
    seconds: float = 0.0


def check(arch: Arch, mode: str, model: Any, assistant: Any) -> Result:
    """Run ``mode`` on ``model`` plain, then instrumented; the differences found (none: ``ok``)."""
    t0 = time.perf_counter()
    call = call_of(arch, mode, model, assistant)
    seed = 1234
    expected, plain = _run_plain(model, call, seed)
    reset()
    name = "sweep"
    if mode == "instrument_all":
        instrument_all(model_name=name)
    else:
        instrument(model, model_name=name)
    try:
        got = _outcome(model, call, seed)
    finally:
        uninstrument_all()
        uninstrument(model)
    problems: list[str] = []
    if got != expected:
        problems.append(f"output differs: plain {str(expected)[:200]} / instrumented {str(got)[:200]}")
    gen = {"gen_ai.request.model": name}
    if expected[0] == "raised":
        if _counts("gen_ai.server.request.duration", **gen, **{"error.type": expected[1]}) != 1:
            problems.append("the failed call is not counted with its error.type")
        status = "FAILED" if problems else "unsupported"
        return Result(arch.name, mode, status, "; ".join(problems) or f"{expected[1]}: {expected[2][:120]}",
                      time.perf_counter() - t0)
    want = {
        "requests": (_counts("gen_ai.server.request.duration", **gen), 1),
        "output tokens": (_sums("gen_ai.client.token.usage", **gen, **{"gen_ai.token.type": "output"}),
                          call.rows * NEW),
        "prefill steps": (_counts("gpuprobe.step.duration", model=name, phase="prefill", clock="host"), 1),
        "decode steps": (_counts("gpuprobe.step.duration", model=name, phase="decode", clock="host"),
                         plain.forwards - 1),
        "TTFT": (_counts("gen_ai.server.time_to_first_token", **gen, clock="host"), 1),
        "inter-token samples": (_counts("gpuprobe.inter_token.duration", model=name, clock="host"), NEW - 1),
    }
    if call.input_tokens is not None:
        want["input tokens"] = (_sums("gen_ai.client.token.usage", **gen, **{"gen_ai.token.type": "input"}),
                                call.input_tokens)
    if mode in ("assisted", "prompt_lookup"):
        spec = {"model": name}
        want["speculative steps"] = (_counts("gpuprobe.speculative.emitted_tokens", **spec), len(plain.steps))
        want["drafts"] = (_counts("gpuprobe.speculative.drafts", **spec), sum(1 for d, _ in plain.steps if d))
        want["draft tokens"] = (_counts("gpuprobe.speculative.draft_tokens", **spec), sum(d for d, _ in plain.steps))
        want["accepted tokens"] = (_counts("gpuprobe.speculative.accepted_tokens", **spec),
                                   sum(a for _, a in plain.steps))
        want["emitted tokens"] = (_sums("gpuprobe.speculative.emitted_tokens", **spec), NEW * call.rows)
    if mode == "streamer":
        want["streamer samples"] = (_counts("gpuprobe.step.component.duration", model=name, component="streamer"),
                                    plain.forwards)
    problems += [f"{what}: {got_n:g}, expected {want_n:g}" for what, (got_n, want_n) in want.items() if got_n != want_n]
    detail = "; ".join(problems)
    if not problems and mode in ("assisted", "prompt_lookup"):
        detail = (f"{len(plain.steps)} steps, {sum(d for d, _ in plain.steps)} drafted, "
                  f"{sum(a for _, a in plain.steps)} accepted")
    return Result(arch.name, mode, "FAILED" if problems else "ok", detail, time.perf_counter() - t0)


def sweep_arch(arch: Arch, modes: tuple[str, ...] = MODES) -> list[Result]:
    """Every mode of one architecture (a model that cannot be built: one FAILED result naming why)."""
    try:
        torch.manual_seed(0)
        model = arch.build().eval()
        assistant = copy.deepcopy(model)
        with torch.no_grad():  # the draft model: the same weights, its output layer a little disturbed
            head = assistant.get_output_embeddings()
            if head is not None and getattr(head, "weight", None) is not None:
                head.weight.add_(torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(1)) * 0.01)
    except Exception as exc:
        return [Result(arch.name, "build", "FAILED", f"{type(exc).__name__}: {exc}"[:300])]
    return [check(arch, mode, model, assistant) for mode in modes]
