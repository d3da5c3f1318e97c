"""The simulated CUDA's seam to torch's private names (gpuprobe/testing/simcuda/_torch_compat.py): the only
module that reaches them, and the torch releases the simulation installs on."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import gpuprobe.testing.simcuda._torch_compat as compat
from gpuprobe.testing.simcuda import SimulatedCuda

PACKAGE = Path(compat.__file__).parent
_ACCESSORS = {"getattr", "setattr", "hasattr", "delattr"}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def torch_private_names() -> frozenset[str]:
    """The private attribute names of the torch objects the simulation reads or replaces, read from the
    installed torch (the CUDA-only ones a CPU build lacks are added by hand)."""
    import torch.autograd.profiler
    import torch.profiler._utils

    owners = [torch, torch.cuda, torch.cuda.memory, torch.cuda.graphs, torch.cuda.streams, torch.cuda.random,
              torch.cuda._utils, torch._C, torch._C._autograd, torch._C._profiler, torch.profiler,
              torch.profiler._utils, torch.profiler.profiler, torch.autograd.profiler, torch.profiler.profile,
              torch.autograd.profiler.profile, torch.autograd.profiler.record_function,
              vars(torch.autograd.profiler.profile())]
    names = {n for owner in owners for n in (owner if isinstance(owner, dict) else dir(owner)) if _is_private(n)}
    names |= {"_cuda_attach_out_of_memory_observer", "_cudart", "_KinetoEvent"}  # CUDA builds; profiler C types
    return frozenset(names)


def own_names(tree: ast.AST) -> set[str]:
    """Attribute names the simulation gives its own objects: set on self or a class, declared in a class
    body or ``__slots__``, or methods."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    own.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    own.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    for target in item.targets:
                        if isinstance(target, ast.Name):
                            own.add(target.id)
                            if target.id == "__slots__" and isinstance(item.value, ast.Tuple):
                                own |= {e.value for e in item.value.elts if isinstance(e, ast.Constant)}
    return own


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def private_torch_reaches(source: str, private: frozenset[str], own: set[str]) -> list[str]:
    """Where ``source`` reaches a private torch name: an attribute chain from ``torch`` (or
    ``import_torch()``) through a private name; a private name of torch's (not one the simulation gives
    its own objects) read off any other expression; ``getattr``/``setattr``/``hasattr``/``delattr`` with a
    literal private name; or a string naming one of torch's private attributes (an attribute to patch)."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            root = _root(node)
            from_torch = isinstance(root, ast.Name) and root.id in ("torch", "import_torch")
            if from_torch or (node.attr in private and node.attr not in own and not isinstance(node.value, ast.Name)):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ACCESSORS:
            if (len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                    and _is_private(node.args[1].value)):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
              and node.value in private and node.value not in own):
            found.append(f"{node.lineno}: {node.value!r}")
    return found


def test_the_finder_sees_each_way_of_reaching_a_private_torch_name() -> None:
    private = frozenset({"_lazy_init", "_prepare_trace", "_tls", "_sleep"})
    own = {"_tls"}
    cases = {
        "torch.cuda._lazy_init()": True,
        "import_torch().cuda._utils._get_device_index(None)": True,
        "self.profiler._prepare_trace()": True,
        "getattr(autograd, '_profiler_enabled', None)": True,
        "patches = [(cuda, '_sleep', f)]": True,
        "self._sim._tls.streams": False,  # the simulation's own attribute, named as one of torch.cuda's
        "sim._lock": False,
        "def f():\n    '''_sleep'''": False,
    }
    assert {src: bool(private_torch_reaches(src, private, own)) for src in cases} == cases


def test_only_the_compat_module_reaches_private_torch_names() -> None:
    private = torch_private_names()
    sources = {p.name: p.read_text(encoding="utf-8") for p in sorted(PACKAGE.glob("*.py"))}
    own = set().union(*(own_names(ast.parse(s)) for s in sources.values()))
    found = {name: hits for name, src in sources.items() if name != "_torch_compat.py"
             for hits in [private_torch_reaches(src, private, own)] if hits}
    assert found == {}, "reach private torch names through gpuprobe/testing/simcuda/_torch_compat.py"
    assert private_torch_reaches(sources["_torch_compat.py"], private, own), "the finder found none at all"


@pytest.mark.parametrize("version", ["2.10.1", "2.16.0", "3.0.0", "2.2.2+cu121", "nightly"])
def test_install_is_refused_on_a_torch_outside_the_checked_releases(monkeypatch: pytest.MonkeyPatch,
                                                                   version: str) -> None:
    """The message names the installed version, the checked range and the variable that overrides it;
    nothing is left patched."""
    monkeypatch.delenv(compat.UNCHECKED_TORCH_VARIABLE, raising=False)
    monkeypatch.setattr(compat, "torch_version", lambda torch: version)
    available = torch.cuda.is_available
    sim = SimulatedCuda(devices=1)
    with pytest.raises(RuntimeError) as refused:
        sim.install()
    message = str(refused.value)
    assert f"torch {version} is installed" in message
    assert "checked against torch 2.11 to 2.15" in message
    assert "GPUPROBE_SIMCUDA_UNCHECKED_TORCH=1" in message
    assert torch.cuda.is_available is available
    assert not sim.installed


@pytest.mark.parametrize("version", ["2.11.0", "2.12.1+cu126", "2.13.0+cpu", "2.14.0", "2.15.0.dev20260101"])
def test_install_goes_ahead_on_each_checked_release(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    monkeypatch.delenv(compat.UNCHECKED_TORCH_VARIABLE, raising=False)
    monkeypatch.setattr(compat, "torch_version", lambda torch: version)
    with SimulatedCuda(devices=1) as sim:
        assert torch.cuda.is_available() and sim.installed


@pytest.mark.parametrize(("setting", "installs"), [("1", True), ("0", False), ("", False), ("yes", False)])
def test_the_variable_set_to_1_lets_an_unchecked_torch_install(monkeypatch: pytest.MonkeyPatch, setting: str,
                                                               installs: bool) -> None:
    monkeypatch.setenv("GPUPROBE_SIMCUDA_UNCHECKED_TORCH", setting)
    monkeypatch.setattr(compat, "torch_version", lambda torch: "2.16.0")
    sim = SimulatedCuda(devices=1)
    if not installs:
        with pytest.raises(RuntimeError, match=r"torch 2\.16\.0 is installed"):
            sim.install()
        return
    with sim:
        assert torch.cuda.device_count() == 1
