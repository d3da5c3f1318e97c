"""MODEL, as ``gpuprobe try`` names it: a local Hugging Face folder, or ``module:factory`` / ``file.py:factory``.

A factory is a callable of no arguments returning ``(model, generate_kwargs)``: the model as it should
run (device, dtype, attention) and the keyword arguments of its ``generate()`` call, inputs, logits
processors and stopping criteria included. While ``file.py`` and its factory run, the file's folder is
first on ``sys.path``, as ``python file.py`` would put it (the modules beside it import). A folder is loaded with
``AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)``; its prompt is a fixed text
through the folder's tokenizer (token ids when it has none), stretched by ``--prompt-lens``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from gpuprobe.errors import ConfigError

from .faults import Fault, ModelFailed

__all__ = ["Loaded", "load", "PROMPT"]

PROMPT = ("A GPU runs thousands of threads at once; a decode step of a language model reads every weight "
          "once per generated token, so its speed is set by memory bandwidth and by how fast the host "
          "launches the step's kernels.")


@dataclasses.dataclass
class Loaded:
    """What MODEL named: the model, its generate() keyword arguments, and how to name it."""

    model: Any
    kwargs: dict[str, Any]
    label: str


def load(spec: str, *, device: str | None = None) -> Loaded:
    """Load MODEL.

    Raises:
        ConfigError: MODEL is neither a folder nor ``module:factory``, the factory is missing or returns
            something else than ``(model, dict)``; the message names it.
        ModelFailed: MODEL's own code or files raised: the folder does not load (a damaged weights file is
            named), the factory's module or the factory raised (its file and line are named).
    """
    if os.path.isdir(spec):
        return _folder(spec, device)
    if device is not None:
        raise ConfigError("--device applies to a model folder; a factory puts its model where it runs")
    module, sep, name = spec.rpartition(":")
    if not sep or not module or not name:
        hint = (" (a hub name? gpuprobe try downloads nothing: download the model first, e.g. "
                f"huggingface-cli download {spec} --local-dir DIR, and name DIR)" if spec.count("/") == 1 else "")
        raise ConfigError(f"MODEL {spec!r} is neither a folder nor module:factory{hint}")
    with _beside(module):
        factory = getattr(_module(module), name, None)
        if not callable(factory):
            raise ConfigError(f"MODEL {spec!r}: {module} has no callable {name!r}")
        try:
            made = factory()
        except Exception as exc:
            raise ModelFailed(Fault.of(exc, f"the factory {spec}")) from exc
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[1], Mapping)):
        raise ConfigError(f"MODEL {spec!r}: the factory must return (model, generate_kwargs), got "
                          f"{type(made).__name__}")
    model, kwargs = made
    if not callable(getattr(model, "generate", None)):
        raise ConfigError(f"MODEL {spec!r}: the factory's model cannot generate ({type(model).__name__})")
    return Loaded(model, dict(kwargs), spec)


def _is_file(module: str) -> bool:
    return module.endswith(".py") or os.sep in module


@contextlib.contextmanager
def _beside(module: str) -> Iterator[None]:
    """While a ``file.py`` factory's module loads and its factory runs, the file's folder is first on
    ``sys.path``, as ``python file.py`` puts it: the modules beside the file import. Put back after."""
    if not _is_file(module):
        yield
        return
    folder = os.path.dirname(os.path.abspath(module))
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        try:
            sys.path.remove(folder)  # the first one: the one inserted, unless the factory moved it
        except ValueError:  # the user's code took it out itself
            pass


def _module(module: str) -> Any:
    if _is_file(module):
        if not os.path.isfile(module):
            raise ConfigError(f"MODEL: no file {module!r}")
        name = "gpuprobe_try_" + os.path.splitext(os.path.basename(module))[0]
        spec = importlib.util.spec_from_file_location(name, module)
        if spec is None or spec.loader is None:
            raise ConfigError(f"MODEL: cannot load {module!r} as Python")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise ModelFailed(Fault.of(exc, f"importing {module}")) from exc
        return mod
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: the current folder's modules are found
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            raise ConfigError(f"MODEL: no module {module!r} (from the current folder or sys.path)") from None
        raise ModelFailed(Fault.of(exc, f"importing {module}")) from exc
    except Exception as exc:
        raise ModelFailed(Fault.of(exc, f"importing {module}")) from exc


def _damaged_weights(folder: str) -> str | None:
    """The folder's safetensors files whose header does not read (cut short, overwritten); None when every
    one reads (or safetensors is not installed)."""
    try:
        from safetensors import safe_open
    except ImportError:
        return None
    bad = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".safetensors"):
            continue
        path = os.path.join(folder, name)
        try:
            with safe_open(path, framework="pt"):  # reads the header alone, checked against the file's size
                pass
        except Exception:
            bad.append(path)
    return ", ".join(bad) or None


def _folder(path: str, device: str | None) -> Loaded:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)  # type: ignore[arg-type]
    except Exception as exc:  # the folder's own files: a missing config, a damaged weights file
        damaged = _damaged_weights(path)
        if damaged is None and isinstance(exc, (OSError, ValueError)):
            raise ConfigError(f"MODEL {path!r}: not a model folder transformers can load: {exc}") from None
        raise ModelFailed(Fault.of(exc, f"loading MODEL {path!r} (AutoModelForCausalLM.from_pretrained)",
                                   where=damaged)) from exc
    try:
        model = model.to(target).eval()
    except Exception as exc:  # no room on the device, a device that is not there
        raise ModelFailed(Fault.of(exc, f"moving MODEL {path!r} to {target}")) from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    except (OSError, ValueError, TypeError):
        vocab = int(getattr(model.config, "vocab_size", 100) or 100)
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(min(3, vocab - 1), vocab, (1, 32), generator=generator)
    ids = ids.to(target)
    kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    eos = getattr(model.generation_config, "eos_token_id", None)
    if getattr(model.generation_config, "pad_token_id", None) is None and eos is not None:
        kwargs["pad_token_id"] = eos[0] if isinstance(eos, list) and eos else eos  # what generate() would pick
    return Loaded(model, kwargs, os.path.basename(os.path.normpath(path)) or path)
