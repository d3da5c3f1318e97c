"""What docs/architecture.md promises about where other libraries' insides are touched, checked on the code.

Two promises, each read from the source with :mod:`ast` (no import of torch or an integrated library needed):

**Every reading of an integrated library's own objects is in its compat module.** For each row of
``gpuprobe.integrations.registry`` (its ``library``, its ``compat`` module, its ``objects``), in every
module of the integration (its public module and its private package), a *library object* is

- a name bound to a module of the library (``import <library>``, ``from <library>... import x``,
  ``sys.modules["<library>..."]``, the compat module's ``import_<library>()``);
- a name the integration gives to the objects the library hands it (the row's ``objects``: ``model``,
  ``scheduler``, ``cache``, ...), or ``self.<that name>``;
- a name assigned (in the same function, or one enclosing it) from an expression that starts at one of
  the above (``state = fs.state``; ``for fs in batch``, where ``batch`` is one).

A *reading* is ``obj.attribute`` (loaded, called or not), ``getattr(obj, "attribute")`` or
``hasattr(obj, "attribute")`` on a library object, for any attribute that is neither a dunder
(``__dict__``: gpuprobe's own state on the instance, ``__class__``) nor in :data:`STABLE_API` (torch's
``nn.Module`` methods, which are torch's promise, not the library's), nor the method of a declared seam
of that library (those are read and shape-checked by :mod:`gpuprobe._seams`). Every attribute of a
library object counts, not only ``_private`` ones: public ones move between releases too (a model's
``past_key_values`` became ``cache``).

**Every private torch name is in** ``gpuprobe/_torch_caps.py`` (or ``gpuprobe/testing/simcuda/_torch_compat.py``,
the simulated CUDA's own). Anywhere else in ``gpuprobe/``, a *private torch name* is

- an import of a torch module whose dotted path has a part starting with ``_`` (``torch._C``,
  ``torch.cuda._utils``), or of a name starting with ``_`` from a torch module;
- an attribute starting with ``_`` (not a dunder) anywhere in a chain that starts at a name bound to
  torch (any name ``torch``, ``import torch``, ``from torch import cuda``, ``sys.modules["torch"]``, ``import_module("torch")``,
  or a name assigned from such a chain): ``torch._C.X``, ``torch.ops.profiler._record_function_enter_new``,
  ``torch.autograd.profiler._x``;
- ``getattr``/``hasattr`` of such a chain with a constant name starting with ``_``;
- ``import_module`` / ``sys.modules`` of a dotted torch path with a private part.

Both scans are shown to fail on planted violations below (in a library of the tests' own, ``toylib``),
so a change that breaks a promise is a failing test, not a stale sentence.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuprobe.integrations import registry

PACKAGE = Path(__file__).resolve().parents[1] / "gpuprobe"
TORCH_COMPAT = (PACKAGE / "_torch_caps.py", PACKAGE / "testing" / "simcuda" / "_torch_compat.py")
TORCH_SEAM_MODULES = {
    # The sync audit's seam (`torch.sync_audit.kernels`) is torch's dispatcher itself: its targets are
    # torch._C's dispatch keys, guards and mode stack, and a PreDispatch kernel's own op handle (`op._op`),
    # which the audit registers kernels on and reads inside them, all looked up once in `_build()`
    # (gpuprobe/_sync_audit.py); docs/architecture.md's rule is for private names that are
    # not a seam's targets. Listed by what it uses, so a new private name there fails here too.
    PACKAGE / "_sync_audit.py": frozenset({
        "from torch._C import DispatchKey, DispatchKeySet",
        "torch._C._IncludeDispatchKeyGuard", "torch._C._ExcludeDispatchKeyGuard", "op._op",
        "torch._C._dispatch_tls_is_dispatch_key_included", "torch._C._TorchDispatchModeKey",
        "torch._C._get_dispatch_mode", "getattr(torch._ops, '_higher_order_ops', {})", "torch._ops",
        "from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy",
    }),
}
"""The one module outside the torch compat modules allowed private torch names, and exactly which."""

TOY_OBJECTS = frozenset({"model", "config", "manager", "bp", "scheduler", "fs"})
"""The names a planted integration of ``toylib`` holds its objects under (as a row's ``objects``)."""

STABLE_API = frozenset({
    # torch.nn.Module's own methods, which every model of an integrated library has by being a Module.
    "named_modules", "modules", "parameters", "register_forward_hook", "register_forward_pre_hook",
})
"""Attributes of a library's objects read outside its compat module that are not the library's to change."""


@dataclass(frozen=True)
class Hit:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _inner(node: ast.AST) -> ast.AST | None:
    """One link down an attribute/call/subscript chain; ``getattr(x, ...)`` continues at ``x``."""
    if isinstance(node, (ast.Attribute, ast.Subscript, ast.Await)):
        return node.value
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id == "getattr" and node.args:
            return node.args[0]
        return func
    return None


def _chain(node: ast.AST) -> Iterator[ast.AST]:
    """The links of a chain, from the outermost to its start."""
    current: ast.AST | None = node
    while current is not None:
        yield current
        current = _inner(current)


def _root(node: ast.AST) -> ast.AST:
    """The start of an attribute/call/subscript chain (``a`` of ``a.b(c)[d].e``)."""
    while True:
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id == "getattr" and node.args:
                node = node.args[0]
                continue
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Await):
            node = node.value
        else:
            return node


def _targets(node: ast.AST) -> Iterator[ast.AST]:
    if isinstance(node, (ast.Tuple, ast.List)):
        for elt in node.elts:
            yield from _targets(elt)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)
    else:
        yield node


def _const_str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _module_lookup(node: ast.AST) -> str | None:
    """The module a ``sys.modules[...]``, ``sys.modules.get(...)`` or ``import_module(...)`` expression names."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "modules":
        return _const_str(node.slice)
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name == "import_module" or (name == "get" and isinstance(func, ast.Attribute)
                                        and isinstance(func.value, ast.Attribute) and func.value.attr == "modules"):
            return _const_str(node.args[0])
    return None


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class _Scan(ast.NodeVisitor):
    """One module's scan: bindings of the library's modules and objects, then the readings of them.

    ``library``: ``"torch"`` or an integrated library's module. Names are tracked per function (a nested function
    sees its enclosing function's), flow-insensitively: a name bound anywhere in a function to the
    library counts everywhere in it.
    """

    def __init__(self, library: str, path: str, objects: frozenset[str] = frozenset(),
                 allowed: frozenset[str] = frozenset(), only_private: bool = False) -> None:
        self.library = library
        self.path = path
        self.objects = objects
        self.allowed = allowed
        self.only_private = only_private
        self.hits: list[Hit] = []
        self.scopes: list[set[str]] = [set()]

    # -- what is bound to the library -----------------------------------------------------------------
    def _of_library(self, module: str | None) -> bool:
        return module is not None and (module == self.library or module.startswith(self.library + "."))

    def _bound(self, node: ast.AST) -> bool:
        """Whether ``node`` (an expression) starts at the library."""
        looked_up = _module_lookup(node)
        if looked_up is not None:
            return self._of_library(looked_up)
        for link in _chain(node):
            if isinstance(link, ast.Attribute) and link.attr.startswith("__") and link.attr.endswith("__"):
                return False  # x.__dict__, type(x).__mro__: Python's own, and gpuprobe's state on the object
            if isinstance(link, ast.Attribute) and not self.only_private and link.attr in self.allowed:
                return False  # what torch's Module API returns (parameters, submodules) is torch's
            looked_up = _module_lookup(link)
            if looked_up is not None:
                return self._of_library(looked_up)
            if isinstance(link, ast.Call) and isinstance(link.func, ast.Name) and link.func.id == "getattr":
                name = _const_str(link.args[1]) if len(link.args) > 1 else None
                if name is not None and name.startswith("__") and name.endswith("__"):
                    return False
            if isinstance(link, ast.Call) and isinstance(link.func, ast.Name):
                if link.func.id == f"import_{self.library}":
                    return True  # the compat module's import_<library>()
                if link.func.id != "getattr":
                    return False  # type(x), len(x), a function of gpuprobe's: its result is not the object
            if isinstance(link, ast.Attribute) and isinstance(link.value, ast.Name) and link.value.id == "self":
                if link.attr in self.objects:
                    return True
            if isinstance(link, ast.Name):
                return link.id in self.scopes[-1] or link.id in self.objects
        return False

    def _collect(self, body: list[ast.stmt], args: ast.arguments | None) -> set[str]:
        """The names this function (or module) binds to the library: imports and assignments, to a fixed point."""
        bound = set(self.scopes[-1])
        nodes = [n for stmt in body for n in self._walk_scope(stmt)]
        changed = True
        while changed:
            changed = False
            self.scopes.append(bound)
            for node in nodes:
                new: list[str] = []
                if isinstance(node, ast.Import):
                    new = [(a.asname or a.name.split(".")[0]) for a in node.names if self._of_library(a.name)]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and self._of_library(node.module):
                    new = [(a.asname or a.name) for a in node.names]
                elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                    if self._bound(node.value):
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        new = [t.id for tg in targets for t in _targets(tg) if isinstance(t, ast.Name)]
                elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                    if self._bound(node.iter):
                        new = [t.id for t in _targets(node.target) if isinstance(t, ast.Name)]
                elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                    if self._bound(node.context_expr):
                        new = [t.id for t in _targets(node.optional_vars) if isinstance(t, ast.Name)]
                elif isinstance(node, ast.NamedExpr) and self._bound(node.value):
                    new = [node.target.id]
                for name in new:
                    if name not in bound:
                        bound.add(name)
                        changed = True
            self.scopes.pop()
        return bound

    @staticmethod
    def _walk_scope(node: ast.AST) -> Iterator[ast.AST]:
        """The nodes of one scope: nested functions and classes are scopes of their own."""
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            yield from _Scan._walk_scope(child)

    # -- scopes ------------------------------------------------------------------------------------
    def visit_Module(self, node: ast.Module) -> None:
        self.scopes = [self._collect(node.body, None)]
        self.generic_visit(node)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        body = node.body if isinstance(node.body, list) else [ast.Expr(node.body)]
        self.scopes.append(self._collect(body, node.args))
        self.generic_visit(node)
        self.scopes.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function  # type: ignore[assignment]

    # -- readings ----------------------------------------------------------------------------------
    def _counts(self, attr: str) -> bool:
        if attr.startswith("__") and attr.endswith("__"):
            return False
        if self.only_private:
            return attr.startswith("_")
        return attr not in self.allowed

    def _hit(self, node: ast.AST, what: str) -> None:
        line = getattr(node, "lineno", 0)
        # One hit per chain: torch._C._autograd._x is reported once, not for each private link in it.
        if any(h.line == line and h.what.startswith(what) for h in self.hits):
            return
        self.hits.append(Hit(self.path, line, what))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if self._counts(node.attr) and self._bound(node.value):
            self._hit(node, f"{ast.unparse(node)}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("getattr", "hasattr") and len(node.args) >= 2:
            name = _const_str(node.args[1])
            if name is not None and self._counts(name) and self._bound(node.args[0]):
                self._hit(node, ast.unparse(node))
        looked_up = _module_lookup(node)
        if self.only_private and looked_up and self._of_library(looked_up) and any(
                _is_private(p) for p in looked_up.split(".")):
            self._hit(node, ast.unparse(node))
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        looked_up = _module_lookup(node)
        if self.only_private and looked_up and self._of_library(looked_up) and any(
                _is_private(p) for p in looked_up.split(".")):
            self._hit(node, ast.unparse(node))
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if self.only_private and self._of_library(alias.name) and any(_is_private(p) for p in alias.name.split(".")):
                self._hit(node, f"import {alias.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if self.only_private and node.level == 0 and self._of_library(node.module):
            assert node.module is not None
            private = [a.name for a in node.names if _is_private(a.name)]
            if any(_is_private(p) for p in node.module.split(".")) or private:
                self._hit(node, f"from {node.module} import {', '.join(a.name for a in node.names)}")


def library_reads(source: str, library: str, objects: frozenset[str], path: str = "<source>",
                  allowed: frozenset[str] = STABLE_API) -> list[Hit]:
    """Every reading of an attribute of ``library``'s objects in ``source`` (see the module's docstring)."""
    scan = _Scan(library, path, objects, allowed)
    scan.visit(ast.parse(source))
    return scan.hits


def toy_reads(source: str) -> list[Hit]:
    """:func:`library_reads` of the planted library ``toylib``."""
    return library_reads(source, "toylib", TOY_OBJECTS)


def torch_private_names(source: str, path: str = "<source>") -> list[Hit]:
    """Every use of a private torch name in ``source`` (see the module's docstring)."""
    # A name ``torch`` is the torch module wherever it is bound (a parameter too: _torch_caps takes it so).
    scan = _Scan("torch", path, frozenset({"torch"}), only_private=True)
    scan.visit(ast.parse(source))
    return scan.hits


def _module_path(module: str) -> Path:
    """The file or folder of a module of gpuprobe, by its dotted name."""
    base = PACKAGE.parent.joinpath(*module.split("."))
    return base if base.is_dir() else base.with_suffix(".py")


def _integration_files(row: registry.Integration) -> list[Path]:
    """The modules of an integration: its public module and every module of its private package."""
    package = _module_path(row.package)
    return sorted({_module_path(row.module), *(package.rglob("*.py") if package.is_dir() else [package])})


def _seam_attributes(row: registry.Integration) -> frozenset[str]:
    """The methods of the library's objects that are declared seams (read through gpuprobe._seams)."""
    pytest.importorskip(row.library)
    import importlib
    import pkgutil

    from gpuprobe import _seams

    importlib.import_module(row.module)
    package = importlib.import_module(row.package)
    for info in pkgutil.walk_packages(package.__path__, prefix=row.package + "."):
        importlib.import_module(info.name)
    return frozenset(s.attribute for s in _seams.registry() if s.library == row.library and s.attribute)


def _relative(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


ROWS = registry.INTEGRATIONS


# -- the promises ------------------------------------------------------------------------------------

@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_every_reading_of_a_librarys_objects_is_in_its_compat_module(row: registry.Integration) -> None:
    allowed = STABLE_API | _seam_attributes(row)
    compat = _module_path(row.compat)
    hits = [hit for path in _integration_files(row) if path != compat
            for hit in library_reads(path.read_text(encoding="utf-8"), row.library, frozenset(row.objects),
                                     _relative(path), allowed)]
    assert [str(h) for h in hits] == [], f"read {row.library}'s objects through {_relative(compat)}"


def test_every_private_torch_name_is_in_the_torch_compat_modules() -> None:
    hits = [hit for path in sorted(PACKAGE.rglob("*.py")) if path not in TORCH_COMPAT
            for hit in torch_private_names(path.read_text(encoding="utf-8"), _relative(path))
            if hit.what not in TORCH_SEAM_MODULES.get(path, ())]
    assert [str(h) for h in hits] == [], "look private torch names up in gpuprobe/_torch_caps.py"


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_each_compat_module_exists_and_is_scanned_as_a_user(row: registry.Integration) -> None:
    # The exemption names a real file of the integration, and the scan sees what it does (so it is needed).
    compat = _module_path(row.compat)
    assert compat.is_file() and compat in _integration_files(row)
    assert library_reads(compat.read_text(encoding="utf-8"), row.library, frozenset(row.objects))


def test_the_torch_compat_modules_exist_and_are_scanned_as_users() -> None:
    for path in TORCH_COMPAT:
        assert path.is_file()
        assert torch_private_names(path.read_text(encoding="utf-8")), path


# -- the scans catch what they are meant to catch ----------------------------------------------------

@pytest.mark.parametrize("source", [
    "def f(bp):\n    return bp.scheduler\n",
    "def f(model):\n    return getattr(model, '_no_split_modules', None)\n",
    "def f(model):\n    return hasattr(model, 'hf_device_map')\n",
    "def f(self):\n    return len(self.scheduler.active_requests)\n",
    "def f(batch, bp):\n    for fs in bp.scheduled:\n        state = fs.state\n        return state.request_id\n",
    "def f(manager):\n    def inner():\n        return manager.output_router\n    return inner\n",
    "import toylib\nX = toylib.generation.utils.GenerationMixin\n",
    "from toylib.generation import utils\nX = utils._sample\n",
    "import sys\nu = sys.modules.get('toylib.generation.utils')\nD = u.DeferredStopCheck\n",
    "def f(config):\n    return config.get_text_config()\n",
    "from .compat import import_toylib\ndef f():\n    return import_toylib().GenerationMixin\n",
])
def test_the_library_scan_finds_a_planted_reading(source: str) -> None:
    assert len(toy_reads(source)) >= 1, source


@pytest.mark.parametrize("source", [
    "def f(model):\n    return list(model.named_modules())\n",  # torch's nn.Module API
    "def f(model, KEY):\n    return model.__dict__.get(KEY)\n",  # gpuprobe's state on the instance
    "def f(self):\n    return self.serving.queue\n",  # gpuprobe's own objects
    "def f(ctx):\n    return ctx.step + 1\n",
])
def test_the_library_scan_passes_what_is_not_a_reading(source: str) -> None:
    assert toy_reads(source) == []


@pytest.mark.parametrize("source", [
    "import torch\nX = torch._C.DisableTorchFunctionSubclass\n",
    "import torch\nX = torch.ops.profiler._record_function_enter_new\n",
    "import sys\ndef f():\n    torch = sys.modules['torch']\n    return torch.autograd.profiler._x\n",
    "import sys\ndef f():\n    p = sys.modules.get('torch.autograd.profiler')\n    return p._profiler_running\n",
    "import torch\ndef f():\n    cuda = torch.cuda\n    return cuda._lazy_init()\n",
    "import torch\nX = getattr(torch.cuda, '_is_in_bad_fork', None)\n",
    "from torch import _C\n",
    "import torch._dynamo\n",
    "from torch.cuda._utils import _get_device_index\n",
    "import importlib\nm = importlib.import_module('torch._inductor')\n",
    "import sys\nm = sys.modules.get('torch._dynamo')\n",
])
def test_the_torch_scan_finds_a_planted_private_name(source: str) -> None:
    assert len(torch_private_names(source)) >= 1, source


@pytest.mark.parametrize("source", [
    "import torch\nX = torch.cuda.Event\n",
    "import torch\nV = torch.__version__\n",
    "def f(x):\n    return x._private\n",  # not torch's
    "from . import _torch_caps\nX = _torch_caps.profiler_enabled_here\n",  # gpuprobe's own private module
])
def test_the_torch_scan_passes_public_names(source: str) -> None:
    assert torch_private_names(source) == []
