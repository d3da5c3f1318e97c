"""Tiny real diffusers pipelines built from configs, as diffusers' own tests build them (their
``get_dummy_components``), with random weights: no download, no network.

The tokenizers are trained here, on a few sentences, with the ``tokenizers`` library (a CLIP-style BPE
and a T5-style Unigram), and handed to transformers' own tokenizer classes; everything else is diffusers'
and transformers' real code. Each builder seeds torch itself, so two builds are the same weights.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")

TEXTS = ("a painting of a squirrel eating a burger", "a photo of an astronaut riding a horse on the moon",
         "a cat sitting on a mat", "an oil painting of a lighthouse at dusk")
PROMPT = "a painting of a squirrel eating a burger"


@functools.lru_cache(maxsize=None)
def _clip_vocab() -> tuple[dict[str, int], tuple[tuple[str, str], ...]]:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(end_of_word_suffix="</w>", unk_token="<|endoftext|>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<|startoftext|>", "<|endoftext|>"],
                                  end_of_word_suffix="</w>", show_progress=False)
    tok.train_from_iterator(list(TEXTS) * 4, trainer)
    model = json.loads(tok.to_str())["model"]
    merges = tuple(tuple(m) if isinstance(m, list) else tuple(m.split()) for m in model["merges"])
    return dict(model["vocab"]), merges  # type: ignore[return-value]


def clip_tokenizer() -> Any:
    """A CLIP tokenizer (transformers' ``CLIPTokenizer``) over a BPE trained here; 77 tokens long, as CLIP's."""
    vocab, merges = _clip_vocab()
    tok = transformers.CLIPTokenizer(vocab=dict(vocab), merges=list(merges))
    tok.model_max_length = 77
    return tok


@functools.lru_cache(maxsize=None)
def _t5_vocab() -> tuple[tuple[str, float], ...]:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=80, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>",
                                      show_progress=False)
    tok.train_from_iterator(list(TEXTS) * 4, trainer)
    return tuple((piece, score) for piece, score in json.loads(tok.to_str())["model"]["vocab"])


def t5_tokenizer() -> Any:
    """A T5 tokenizer (transformers' ``T5Tokenizer``) over a Unigram model trained here."""
    tok = transformers.T5Tokenizer(vocab=list(_t5_vocab()), extra_ids=0)
    tok.model_max_length = 64
    return tok


def _clip_config(**extra: Any) -> Any:
    return transformers.CLIPTextConfig(bos_token_id=0, eos_token_id=2, hidden_size=32, intermediate_size=37,
                                       layer_norm_eps=1e-05, num_attention_heads=4, num_hidden_layers=2,
                                       pad_token_id=1, vocab_size=1000, hidden_act="gelu", projection_dim=32, **extra)


def _t5_encoder() -> Any:
    torch.manual_seed(0)
    return transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=1000, d_model=32, d_ff=37, d_kv=8, num_heads=4, num_layers=2, decoder_start_token_id=0,
        pad_token_id=0, eos_token_id=1)).eval()


def _quiet(pipe: Any) -> Any:
    pipe.set_progress_bar_config(disable=True)
    return pipe


def sd_components() -> dict[str, Any]:
    """Stable Diffusion's components (diffusers' tests/pipelines/stable_diffusion, with a wider text encoder)."""
    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel(
        block_out_channels=(4, 8), layers_per_block=1, sample_size=32, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, norm_num_groups=2)
    scheduler = diffusers.DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                        clip_sample=False, set_alpha_to_one=False, steps_offset=1)
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKL(block_out_channels=[4, 8], in_channels=3, out_channels=3,
                                  down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
                                  up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"], latent_channels=4,
                                  norm_num_groups=2)
    torch.manual_seed(0)
    text_encoder = transformers.CLIPTextModel(_clip_config())
    return {"unet": unet, "scheduler": scheduler, "vae": vae, "text_encoder": text_encoder,
            "tokenizer": clip_tokenizer(), "safety_checker": None, "feature_extractor": None, "image_encoder": None}


def sd(**override: Any) -> Any:
    """A tiny ``StableDiffusionPipeline``."""
    parts = {**sd_components(), **override}
    return _quiet(diffusers.StableDiffusionPipeline(**parts, requires_safety_checker=False))


def safety_checker() -> tuple[Any, Any]:
    """A tiny ``StableDiffusionSafetyChecker`` and its feature extractor (a CLIP vision model, random weights)."""
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker

    torch.manual_seed(0)
    config = transformers.CLIPConfig(
        text_config={"hidden_size": 16, "intermediate_size": 16, "num_attention_heads": 2, "num_hidden_layers": 1,
                     "vocab_size": 1000},
        vision_config={"hidden_size": 16, "intermediate_size": 16, "num_attention_heads": 2, "num_hidden_layers": 1,
                       "image_size": 32, "patch_size": 8}, projection_dim=8)
    checker = StableDiffusionSafetyChecker(config).eval()
    extractor = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return checker, extractor


def sd_img2img(**override: Any) -> Any:
    """A tiny ``StableDiffusionImg2ImgPipeline`` (the same components as :func:`sd`)."""
    parts = {**sd_components(), **override}
    return _quiet(diffusers.StableDiffusionImg2ImgPipeline(**parts, requires_safety_checker=False))


def init_image() -> Any:
    """A 32x32 RGB image tensor in [0, 1] (image-to-image's input), the same every time."""
    g = torch.Generator().manual_seed(7)
    return torch.rand((1, 3, 32, 32), generator=g)


def sdxl() -> Any:
    """A tiny ``StableDiffusionXLPipeline`` (diffusers' tests/pipelines/stable_diffusion_xl)."""
    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel(
        block_out_channels=(2, 4), layers_per_block=2, sample_size=32, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4), use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=8, transformer_layers_per_block=(1, 2), projection_class_embeddings_input_dim=80,
        cross_attention_dim=64, norm_num_groups=1)
    scheduler = diffusers.EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, steps_offset=1,
                                                 beta_schedule="scaled_linear", timestep_spacing="leading")
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKL(block_out_channels=[32, 64], in_channels=3, out_channels=3,
                                  down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
                                  up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"], latent_channels=4,
                                  sample_size=128)
    torch.manual_seed(0)
    text_encoder = transformers.CLIPTextModel(_clip_config())
    text_encoder_2 = transformers.CLIPTextModelWithProjection(_clip_config())
    return _quiet(diffusers.StableDiffusionXLPipeline(
        unet=unet, scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=clip_tokenizer(),
        text_encoder_2=text_encoder_2, tokenizer_2=clip_tokenizer(), image_encoder=None, feature_extractor=None))


def sd3() -> Any:
    """A tiny ``StableDiffusion3Pipeline``: a transformer denoiser (MMDiT), two CLIP encoders and a T5."""
    torch.manual_seed(0)
    transformer = diffusers.SD3Transformer2DModel(
        sample_size=32, patch_size=1, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=4,
        caption_projection_dim=32, joint_attention_dim=32, pooled_projection_dim=64, out_channels=4)
    torch.manual_seed(0)
    text_encoder = transformers.CLIPTextModelWithProjection(_clip_config())
    torch.manual_seed(0)
    text_encoder_2 = transformers.CLIPTextModelWithProjection(_clip_config())
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,),
                                  layers_per_block=1, latent_channels=4, norm_num_groups=1, use_quant_conv=False,
                                  use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035)
    return _quiet(diffusers.StableDiffusion3Pipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), text_encoder=text_encoder,
        text_encoder_2=text_encoder_2, text_encoder_3=_t5_encoder(), tokenizer=clip_tokenizer(),
        tokenizer_2=clip_tokenizer(), tokenizer_3=t5_tokenizer(), transformer=transformer, vae=vae,
        image_encoder=None, feature_extractor=None))


def flux() -> Any:
    """A tiny ``FluxPipeline`` (diffusers' tests/pipelines/flux): a transformer denoiser whose true
    classifier-free guidance runs the conditional and unconditional predictions apart."""
    torch.manual_seed(0)
    transformer = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8])
    torch.manual_seed(0)
    text_encoder = transformers.CLIPTextModel(_clip_config())
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,),
                                  layers_per_block=1, latent_channels=1, norm_num_groups=1, use_quant_conv=False,
                                  use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035)
    return _quiet(diffusers.FluxPipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), text_encoder=text_encoder,
        text_encoder_2=_t5_encoder(), tokenizer=clip_tokenizer(), tokenizer_2=t5_tokenizer(),
        transformer=transformer, vae=vae))


def generator(seed: int = 0) -> Any:
    return torch.Generator().manual_seed(seed)


def inputs(kind: str, steps: int = 2, **extra: Any) -> dict[str, Any]:
    """The call's arguments for a pipeline of ``kind`` (``sd``, ``sdxl``, ``sd3``, ``flux``, ``img2img``)."""
    base: dict[str, Any] = {"prompt": PROMPT, "num_inference_steps": steps, "generator": generator(0),
                            "output_type": "pt"}
    if kind == "sd":
        base.update(guidance_scale=6.0, height=32, width=32)
    elif kind == "img2img":
        base.update(guidance_scale=6.0, image=init_image(), strength=1.0)
    elif kind == "sdxl":
        base.update(guidance_scale=5.0, height=32, width=32)
    elif kind == "sd3":
        base.update(guidance_scale=5.0, height=32, width=32)
    elif kind == "controlnet":
        base.update(guidance_scale=6.0, height=32, width=32, image=control_image())
    elif kind == "flux":
        base.update(guidance_scale=5.0, height=8, width=8, max_sequence_length=16, true_cfg_scale=2.0,
                    negative_prompt="a cat sitting on a mat")
    base.update(extra)
    return base


BUILDERS = {"sd": sd, "sdxl": sdxl, "sd3": sd3, "flux": flux, "img2img": sd_img2img}


def controlnet() -> Any:
    """A tiny ``StableDiffusionControlNetPipeline`` (diffusers' tests/pipelines/controlnet): a ControlNet runs
    before the UNet in every step."""
    parts = sd_components()
    torch.manual_seed(0)
    net = diffusers.ControlNetModel(
        block_out_channels=(4, 8), layers_per_block=1, in_channels=4, down_block_types=("DownBlock2D",
                                                                                         "CrossAttnDownBlock2D"),
        cross_attention_dim=32, conditioning_embedding_out_channels=(16, 32), norm_num_groups=2)
    return _quiet(diffusers.StableDiffusionControlNetPipeline(**parts, controlnet=net, requires_safety_checker=False))


def control_image() -> Any:
    """The ControlNet's conditioning image, 32x32, the same every time."""
    return torch.rand((1, 3, 32, 32), generator=torch.Generator().manual_seed(3))


BUILDERS["controlnet"] = controlnet
