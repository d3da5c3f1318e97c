"""Runs the blocks of the docs, as ``tests/test_docs.py`` asks: ``python tests/_docrun.py JOB.json OUT.json``.

JOB.json names a folder to work in and the blocks of each doc (``_dockit.Block``); OUT.json receives one
result per block: ``{"id", "status": "passed"|"failed"|"skipped", "message", "skipped_parts", "seconds"}``.

One process imports torch and transformers and builds the stand-ins of :data:`_dockit.FILES` once, then
forks one child per doc (two at a time, the test machine's cores): a doc's Python blocks run in that
child, in order, in one namespace, and its shell commands run from it in the doc's own working folder
(symbolic links to the shared stand-ins, so no doc sees another's files). Forking is safe here because
the parent holds no thread (checked before each fork; with one, the doc gets a fresh interpreter).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import doctest
import gzip
import io
import json
import lzma
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tokenize
import traceback
import types
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE / "serving")]

import _dockit  # noqa: E402
from _dockit import Block  # noqa: E402

ROOT = _dockit.ROOT
BIN = os.path.dirname(sys.executable)
COMMAND_TIMEOUT = 240  # seconds a command may run (a loaded 2-core machine: torch imports take 10-40 s)
READY_TIMEOUT = 240  # seconds a server may take to answer
DOC_TIMEOUT = 600  # seconds a doc may take in all


# ============================================================================== the stand-ins


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env() -> dict[str, str]:
    """This environment without GPUPROBE_* and OTEL_* variables, the virtual environment's scripts first."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPUPROBE_", "OTEL_", "PYTEST_", "NVTX_")) and k not in ("PYTHONPATH", "COV_CORE_SOURCE")}
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    env["OMP_NUM_THREADS"] = "1"  # two cores, shared by two docs at a time
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["TQDM_DISABLE"] = "1"
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


SERVE_PY = '''"""A server stand-in: the tiny Llama, instrumented, answering requests of 24 tokens (8, or
--requests N); one decode step is slow (0.3 s), as a busy server's are now and then."""
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList

import gpuprobe
from gpuprobe.integrations.transformers import instrument


class BusyMoment(LogitsProcessor):
    steps = 0

    def __call__(self, input_ids, scores):
        BusyMoment.steps += 1
        if BusyMoment.steps == 150:
            time.sleep(0.3)
        return scores


requests = int(sys.argv[sys.argv.index("--requests") + 1]) if "--requests" in sys.argv else 8
torch.manual_seed(0)
tokenizer = AutoTokenizer.from_pretrained("tiny")
model = instrument(AutoModelForCausalLM.from_pretrained("tiny").eval(), model_name="tiny")
inputs = tokenizer(["The GPU is"], return_tensors="pt")
for _ in range(requests):
    model.generate(**inputs, max_new_tokens=24, min_new_tokens=24, logits_processor=LogitsProcessorList([BusyMoment()]))
    time.sleep(0.05)
print(gpuprobe.summary())
'''

APP_PY = '''"""A program that knows nothing of gpuprobe: the tiny Llama through transformers alone."""
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.manual_seed(0)
tokenizer = AutoTokenizer.from_pretrained("tiny")
model = AutoModelForCausalLM.from_pretrained("tiny").eval()
for prompt in ["The GPU is", "hello world"]:
    out = model.generate(**tokenizer([prompt], return_tensors="pt"), max_new_tokens=8, min_new_tokens=8)
    print(out.shape[1])
'''

MYLIB_PY = '''"""A library of the reader's: run() generates with the instrumented tiny Llama."""
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gpuprobe.integrations.transformers import instrument


def run():
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained("tiny")
    model = instrument(AutoModelForCausalLM.from_pretrained("tiny").eval())   # model name: "tiny"
    model.generate(**tokenizer(["The GPU is"], return_tensors="pt"), max_new_tokens=3, min_new_tokens=3)
'''


def build_shared(shared: Path) -> None:
    """The stand-ins every doc's folder links to (see ``_dockit.FILES``)."""
    import tqdm
    from _servekit import build_tiny_model

    tqdm.tqdm.monitor_interval = 0  # saving a model draws a progress bar, whose monitor thread would stop the forks
    shared.mkdir(parents=True, exist_ok=True)
    build_tiny_model(shared / "tiny")
    (shared / "serve.py").write_text(SERVE_PY)
    (shared / "app.py").write_text(APP_PY)
    (shared / "mylib.py").write_text(MYLIB_PY)

    sys.path.insert(0, str(HERE / "report"))
    import test_findings_shapes as shapes

    for name, variant in (("a_dynamic.json", "dynamic"), ("b_graph.json", "graph"),
                          ("dynamic.json", "dynamic"), ("static.json", "static"),
                          ("before.json", "dynamic"), ("after.json", "graph")):
        shapes.experiment(variant).write(shared / name)
    for name in ("dynamic", "static", "before", "after"):
        raw = (shared / f"{name}.json").read_bytes()
        (shared / f"{name}.json").unlink()
        (shared / f"{name}.json.gz").write_bytes(gzip.compress(raw))
    data = ROOT / "tests" / "data"
    with lzma.open(data / "nsys" / "fuser_cross_entropy_h200.sqlite.xz") as f:
        (shared / "decode.sqlite").write_bytes(f.read())


LINKS = {
    "tests/data": "{root}/tests/data",
    "examples": "{root}/examples",
    "tiny": "{shared}/tiny",
    "serve.py": "{shared}/serve.py",
    "app.py": "{shared}/app.py",
    "mylib.py": "{shared}/mylib.py",
    "decode.json.gz": "{root}/tests/data/kineto/tracelens_mi300_sglang_qwen3_decode.json.gz",
    "dynamic.json.gz": "{shared}/dynamic.json.gz",
    "static.json.gz": "{shared}/static.json.gz",
    "a_dynamic.json": "{shared}/a_dynamic.json",
    "b_graph.json": "{shared}/b_graph.json",
    "before.json.gz": "{shared}/before.json.gz",
    "after.json.gz": "{shared}/after.json.gz",
    "decode.sqlite": "{shared}/decode.sqlite",
    "kernels.csv": "{root}/tests/data/ncu/microgpusim_vectoradd_gtx1080_raw.csv",
    "decode.csv": "{root}/tests/data/ncu/microgpusim_vectoradd_gtx1080_raw.csv",
    "details.csv": "{root}/tests/data/ncu/esmm_sgemm_a10g_details.csv",
    "before.csv": "{root}/tests/data/ncu/esmm_sgemm_a10g_details.csv",
    "after.csv": "{root}/tests/data/ncu/llmperfopt_kernel0001_rtx5090_details.csv",
    "kernel_1/ncu.details.csv": "{root}/tests/data/ncu/esmm_sgemm_a10g_details.csv",
    "kernel_2/ncu.details.csv": "{root}/tests/data/ncu/llmperfopt_kernel0001_rtx5090_details.csv",
    "traces": "{root}/tests/data/kineto/param_dlrm_8rank",
    "before": "{root}/tests/data/kineto/param_dlrm_8rank",
    "after": "{root}/tests/data/kineto/param_dlrm_8rank",
    "rank0.json.gz": "{root}/tests/data/kineto/param_dlrm_8rank/rank-0.json.gz",
    "rank1.json.gz": "{root}/tests/data/kineto/param_dlrm_8rank/rank-1.json.gz",
}
assert set(LINKS) | {"deploy", "docs/img"} == set(_dockit.FILES), "FILES and LINKS name the same files"


def make_folder(folder: Path, shared: Path) -> None:
    """A doc's working folder: links to the shared stand-ins, its own copy of deploy/."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, target in LINKS.items():
        link = folder / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target.format(root=ROOT, shared=shared))
    shutil.copytree(ROOT / "deploy", folder / "deploy", ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "docs" / "img").mkdir(parents=True)


# ============================================================================== running one doc


class Failed(Exception):
    """A block did not do what its doc shows."""


class Doc:
    """The state of one doc's run: its Python namespace, its shell environment, its servers."""

    def __init__(self, doc: str, folder: Path, ports: dict[int, int]) -> None:
        self.doc = doc
        self.folder = folder
        self.ports = ports
        self.env = clean_env()
        self.ns: dict[str, Any] | None = None
        self.servers: list[tuple[subprocess.Popen[bytes], Path, list[str]]] = []
        self.last: dict[str, str] = {"stdout": "", "stderr": ""}
        self.skipped: list[str] = []
        self.outputs: dict[str, dict[str, str]] = {}  # command as shown → its output, for `output of`
        self.services: list[Any] = []

    def start(self, text: str) -> None:
        """The services and servers the doc takes as running (the table's SERVICES and SETUP)."""
        for port, _what in _dockit.SERVICES.items():
            if re.search(rf"(?<!\d){port}(?!\d)", text):
                from otlp_receiver import Receiver

                self.services.append(Receiver(port=self.ports[port]))
        for command in _dockit.SETUP.get(self.doc, ()):
            text = self.sub(command)
            self.start_server(text, _dockit.ready_urls(text, self.ports) or [], f"set-up `{command}`")

    # -- text as it runs here
    def sub(self, text: str) -> str:
        return _dockit.substitute(text, self.doc, self.ports)

    # -- Python
    def namespace(self) -> dict[str, Any]:
        if self.ns is None:
            ns: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
            with _captured_stdout():
                exec(compile(_dockit.PRELUDE, "<prelude>", "exec"), ns)
                extra = _dockit.PRELUDE_FOR.get(self.doc)
                if extra:
                    exec(compile(extra, f"<prelude of {self.doc}>", "exec"), ns)
            self.ns = ns
        return self.ns

    def run_python(self, code: str, label: str) -> None:
        why = _dockit.skip_for(code, "python")
        if why:
            raise Skipped(why)
        ns = self.namespace()
        before = {k: v for k, v in ns.items() if k.startswith("test_")}
        tree = ast.parse(code, label)
        tree = _claims(code, tree)
        compiled = compile(tree, label, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        claims: list[str] = []

        def claim(line: int, got: Any, shown: Any) -> Any:
            if got != shown:
                claims.append(f"line {line}: the comment shows {shown!r}, the code gives {got!r}")
            return got

        ns["__doc_claim__"] = claim
        out = io.StringIO()
        with _captured_stdout(out), _gpuprobe_warnings() as caught:
            result = eval(compiled, ns)
            if asyncio.iscoroutine(result):
                asyncio.run(result)
            for name, fn in list(ns.items()):
                if name.startswith("test_") and callable(fn) and before.get(name) is not fn:
                    got = fn()
                    if asyncio.iscoroutine(got):
                        asyncio.run(got)
        self.last = {"stdout": out.getvalue(), "stderr": ""}
        if claims:
            raise Failed("; ".join(claims))
        if caught:
            raise Failed("gpuprobe warned: " + " | ".join(caught))

    def run_doctest(self, block: Block) -> None:
        ns = self.namespace()
        parser = doctest.DocTestParser()
        mode = _dockit.compare_mode(block, "keys")
        for ex in parser.get_examples(block.text):
            source = self.sub(ex.source)
            out = io.StringIO()
            with _captured_stdout(out), _gpuprobe_warnings() as caught:
                try:
                    value = eval(compile(source, block.id, "eval"), ns)
                except SyntaxError:
                    exec(compile(source, block.id, "exec"), ns)
                    value = None
            if caught:
                raise Failed(f"{ex.source.strip()}: gpuprobe warned: " + " | ".join(caught))
            shown = ex.want.strip()
            if not shown:
                continue
            try:
                shown_value = _dockit.parse_value(shown)
            except (ValueError, SyntaxError):
                got = out.getvalue() or repr(value)
                problem = _dockit.compare_text(shown, got, "masked", str(self.folder))
            else:
                problem = _dockit.compare_value(shown_value, value, mode, folder=str(self.folder))
            if problem:
                raise Failed(f"`{ex.source.strip()}`: {problem}")

    # -- shell
    def run_shell(self, block: Block) -> None:
        for cmd in _dockit.shell_commands(block):
            text = self.sub(cmd.text)
            where = f"line {block.line + 1 + cmd.offset}"
            why = _dockit.skip_for(text, "shell")
            if why:
                self.skipped.append(f"{where} `{cmd.text}`: {why}")
                continue
            m = re.match(r"^export (\w+)=(.*)$", text)
            if m:
                self.env[m.group(1)] = subprocess.run(["bash", "-c", f"printf %s {m.group(2)}"], env=self.env,
                                                      capture_output=True, text=True).stdout
                continue
            urls = _dockit.ready_urls(text, self.ports)
            if urls is not None:
                self.start_server(text, urls, where)
                continue
            proc = self.shell(text, where)
            self.last = self.outputs[cmd.text] = {"stdout": proc.stdout, "stderr": proc.stderr}
            with contextlib.suppress(ValueError):
                answer = json.loads(proc.stdout)
                if isinstance(answer, dict) and isinstance(answer.get("path"), str):
                    self.env["GPUPROBE_DOCS_TRACE"] = answer["path"]  # a capture's answer
            if cmd.shown is not None and cmd.shown.strip():
                problem = self.compare(cmd.shown, proc.stdout, _dockit.compare_mode(block, "exact"))
                if problem:
                    raise Failed(f"{where} `{cmd.text}`: {problem}")

    def compare(self, shown: str, got: str, mode: str, lang: str = "") -> str | None:
        """What differs between shown and actual output (a value, when the shown output is one)."""
        folder = str(self.folder)
        try:
            shown_value = _dockit.parse_value(shown)
        except (ValueError, SyntaxError):
            shown_value = None
        if isinstance(shown_value, (dict, list)) or lang == "json":
            if shown_value is None:
                return "the shown value does not parse"
            try:
                actual = _dockit.parse_value(got)
            except (ValueError, SyntaxError):
                return f"the output is not a value to compare with:\n{got[-2000:]}"
            mode = "masked" if mode in ("lines", "head", "part") else mode
            if _dockit.find_value(shown_value, actual, mode, folder):
                return None
            return _dockit.compare_value(shown_value, actual, mode, folder=folder) or "no such value in the output"
        return _dockit.compare_text(shown, got, mode, folder)

    def shell(self, text: str, where: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        trace = self.env.get("GPUPROBE_DOCS_TRACE")
        if "$GPUPROBE_DOCS_TRACE" in text and trace:  # a capture's trace: written after its last step
            deadline = time.monotonic() + COMMAND_TIMEOUT
            while not os.path.exists(trace) and time.monotonic() < deadline:
                time.sleep(0.2)
        try:
            proc = subprocess.run(["bash", "-o", "pipefail", "-c", text], cwd=self.folder, env=self.env,
                                  capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise Failed(f"{where} `{text}` ran over {COMMAND_TIMEOUT} s") from None
        statuses = _dockit.exit_statuses(text)
        if check and proc.returncode not in statuses:
            tail = (proc.stderr or proc.stdout)[-3000:]
            raise Failed(f"{where} `{text}` exited {proc.returncode}:\n{tail}")
        return proc

    def start_server(self, text: str, urls: list[str], where: str) -> None:
        # A server on a port an earlier server of the doc holds takes its place, as a reader would have
        # stopped the first before starting the second.
        self.stop_servers([s for s in self.servers if set(s[2]) & set(urls)])
        log = self.folder / f"server-{len(self.servers)}.log"
        with open(log, "wb") as f:
            proc = subprocess.Popen(["bash", "-c", text], cwd=self.folder, env=self.env, stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.servers.append((proc, log, urls))
        self.env["GPUPROBE_DOCS_SERVER_PID"] = str(proc.pid)
        deadline = time.monotonic() + READY_TIMEOUT
        waiting = list(urls)
        while waiting:
            try:
                with urllib.request.urlopen(waiting[0], timeout=5) as resp:
                    resp.read()
                waiting.pop(0)
                continue
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if proc.poll() is not None:
                raise Failed(f"{where} `{text}` exited {proc.returncode} before {waiting[0]} answered:\n"
                             + log.read_text(errors="replace")[-3000:])
            if time.monotonic() > deadline:
                raise Failed(f"{where} `{text}`: {waiting[0]} did not answer within {READY_TIMEOUT} s:\n"
                             + log.read_text(errors="replace")[-3000:])
            time.sleep(0.3)

    def stop_unneeded(self, later: list[Block]) -> None:
        """Stop the servers no later block of the doc talks to (by the port it serves, or ``<pid>``): a
        server left generating would take a core from the blocks after it."""
        text = "\n".join(b.text for b in later if b.kind not in ("skip", "output"))
        keep_last = "<pid>" in text
        for server in list(self.servers):
            if keep_last and server is self.servers[-1]:
                continue
            fixed = [f for f, free in self.ports.items() if any(f":{free}/" in url for url in server[2])]
            if not any(re.search(rf"(?<![\d.]){f}(?!\d)", text) for f in fixed):
                self.stop_servers([server])

    def stop_servers(self, servers: list[Any] | None = None) -> None:
        for server in list(self.servers if servers is None else servers):
            proc = server[0]
            self.servers.remove(server)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()

    # -- shown output
    def check_output(self, block: Block) -> None:
        spec = _dockit.parse_output_directive(block.directive)
        if spec.command:
            output = self.outputs.get(spec.command)  # the doc ran it already: its output
            if output is None:
                proc = self.shell(self.sub(spec.command), f"`{spec.command}`")
                output = self.outputs[spec.command] = {"stdout": proc.stdout, "stderr": proc.stderr}
        else:
            output = self.last
        problem = self.compare(block.text, output[spec.stream], spec.mode, block.lang)
        if problem:
            raise Failed(problem)


class Skipped(Exception):
    """A block the table leaves out, with the reason."""


@contextlib.contextmanager
def _captured_stdout(out: io.StringIO | None = None) -> Any:
    with contextlib.redirect_stdout(out if out is not None else io.StringIO()):
        yield


@contextlib.contextmanager
def _gpuprobe_warnings() -> Any:
    """The messages of gpuprobe's warnings raised inside (a doc's code should run without one)."""
    caught: list[str] = []
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        yield caught
    for w in ws:
        text = str(w.message)
        if text.startswith("gpuprobe") and not issubclass(w.category, DeprecationWarning):
            caught.append(text[:500])


def _claims(code: str, tree: ast.Module) -> ast.Module:
    """``expr  # <literal>`` at the top level becomes ``__doc_claim__(line, expr, literal)``."""
    comments: dict[int, str] = {}
    with contextlib.suppress(tokenize.TokenError, IndentationError):
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = tok.string[1:].strip()
    for i, node in enumerate(tree.body):
        if not isinstance(node, ast.Expr) or node.end_lineno not in comments:
            continue
        comment = comments[node.end_lineno or 0]
        if not re.match(r"^['\"\d(\[{-]", comment):
            continue
        try:
            shown = ast.literal_eval(comment)
        except (ValueError, SyntaxError):
            continue
        call = ast.Call(ast.Name("__doc_claim__", ast.Load()),
                        [ast.Constant(node.lineno), node.value, ast.Constant(shown)], [])
        tree.body[i] = ast.copy_location(ast.Expr(call), node)
    return ast.fix_missing_locations(tree)


def run_doc(doc: str, blocks: list[Block], folder: Path, ports: dict[int, int]) -> list[dict[str, Any]]:
    """Every block of one doc, in order; one result each."""
    os.chdir(folder)
    sys.path.insert(0, str(folder))
    state = Doc(doc, folder, ports)
    results: list[dict[str, Any]] = []
    try:
        state.start("\n".join(b.text for b in blocks))
    except Failed as exc:
        state.stop_servers()
        return [{"id": b.id, "status": "failed", "message": f"the doc's set-up failed: {exc}", "skipped_parts": [],
                 "seconds": 0.0} for b in blocks]
    pending: list[Block] = []  # Python blocks joined by `continue`

    cpu = [_cpu()]

    def record(block: Block, status: str, message: str = "", t0: float = 0.0) -> None:
        now = _cpu()
        results.append({"id": block.id, "status": status, "message": message, "skipped_parts": state.skipped,
                        "seconds": round(time.monotonic() - t0, 2) if t0 else 0.0, "cpu": round(now - cpu[0], 2)})
        cpu[0] = now
        state.skipped = []

    def attempt(block: Block, fn: Any) -> None:
        t0 = time.monotonic()
        try:
            fn()
        except Skipped as exc:
            record(block, "skipped", str(exc), t0)
        except Failed as exc:
            record(block, "failed", str(exc), t0)
        except Exception:
            record(block, "failed", traceback.format_exc(limit=-6)[-4000:], t0)
        else:
            if state.skipped and block.kind in ("shell", "transcript") and not _ran_any(block, state):
                record(block, "skipped", "; ".join(state.skipped), t0)
            else:
                record(block, "passed", "", t0)

    try:
        for n, block in enumerate(blocks):
            kind = block.kind
            following = blocks[n + 1] if n + 1 < len(blocks) else None
            if kind == "skip":
                try:
                    record(block, "skipped", _dockit.skip_reason(block.directive))
                except ValueError as exc:
                    record(block, "failed", str(exc))
                continue
            if kind == "unclassified":
                record(block, "failed", "a block of text that is neither code nor claimed output: say what it is "
                       "with `<!-- doc-test: output MODE [of `COMMAND`] -->` or `<!-- doc-test: skip (REASON) -->` "
                       "right before it (tests/_dockit.py)")
                continue
            if kind in ("python", "continue"):
                pending.append(block)
                if following is not None and following.kind == "continue":
                    continue
                group, pending = pending, []
                code = "\n".join(state.sub(b.text) for b in group)
                attempt(group[0], lambda: state.run_python(code, group[0].id))
                for b in group[1:]:
                    results.append(dict(results[-1], id=b.id))
                continue
            if kind == "doctest":
                attempt(block, lambda: state.run_doctest(block))
            elif kind in ("shell", "transcript"):
                attempt(block, lambda: state.run_shell(block))
                state.stop_unneeded(blocks[n + 1:])
            elif kind == "output":
                attempt(block, lambda: state.check_output(block))
    finally:
        state.stop_servers()
        for service in state.services:
            service.close()
    return results


def _cpu() -> float:
    """CPU seconds of this process and of the processes it has waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _ran_any(block: Block, state: Doc) -> bool:
    commands = _dockit.shell_commands(block)
    return len(state.skipped) < len(commands)


# ============================================================================== the parent


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def main(job_path: str, out_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    work = Path(job["work"])
    os.environ.clear()
    os.environ.update(clean_env())
    t0 = time.monotonic()
    import torch  # imported once, for every doc's child

    torch.set_num_threads(1)
    build_shared(work / "_shared")
    _warm(work / "_shared")
    shared_seconds = time.monotonic() - t0

    docs: dict[str, list[Block]] = {}
    for raw in job["blocks"]:
        b = Block(**raw)
        docs.setdefault(b.doc, []).append(b)
    results: list[dict[str, Any]] = []
    spawned: list[str] = []  # docs run in a fresh interpreter (slower): the parent had a thread
    running: dict[int, tuple[str, Path, float]] = {}
    queue = sorted(docs, key=lambda d: -_cost(docs[d]))
    parallel = max(1, int(job.get("parallel", 2)))
    while queue or running:
        while queue and len(running) < parallel:
            doc = queue.pop(0)
            folder = work / re.sub(r"[^\w.-]", "_", doc)
            make_folder(folder, work / "_shared")
            ports = {p: free_port() for p in _dockit.FIXED_PORTS}
            result_file = folder / "results.json"
            if _threads() != 1:  # never fork a process with threads: a fresh interpreter instead
                spawned.append(doc)
                pid = _spawn(doc, docs[doc], folder, ports, result_file)
            else:
                pid = os.fork()
                if pid == 0:
                    _child(doc, docs[doc], folder, ports, result_file)
            running[pid] = (doc, result_file, time.monotonic())
        pid, status = _wait_any(running)
        doc, result_file, started = running.pop(pid)
        try:
            results.extend(json.loads(result_file.read_text()))
        except (OSError, ValueError):
            for b in docs[doc]:
                results.append({"id": b.id, "status": "failed", "skipped_parts": [], "seconds": 0.0,
                                "message": f"the run of {doc} ended ({status}) without results"})
    Path(out_path).write_text(json.dumps({"results": results, "shared_seconds": round(shared_seconds, 2),
                                          "spawned": spawned}))
    return 0


def _warm(shared: Path) -> None:
    """What every doc's child would import, imported here once. Nothing started: no thread, no gpuprobe runtime."""
    import opentelemetry.sdk.metrics  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor  # noqa: F401

    import gpuprobe  # noqa: F401
    import gpuprobe.integrations.transformers  # noqa: F401
    import gpuprobe.report  # noqa: F401
    import gpuprobe.testing  # noqa: F401

    import transformers.models.llama.modeling_llama  # noqa: F401  (loading a model here starts a thread)

    AutoTokenizer.from_pretrained(shared / "tiny")


def _cost(blocks: list[Block]) -> int:
    text = "\n".join(b.text for b in blocks)
    return 10 * text.count("transformers serve") + 3 * text.count("python") + len(blocks)


def _wait_any(running: dict[int, tuple[str, Path, float]]) -> tuple[int, int]:
    while True:
        for pid, (doc, _f, started) in running.items():
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return pid, status
            if time.monotonic() - started > DOC_TIMEOUT:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                for _ in range(300):
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        return pid, status
                    time.sleep(0.1)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                return pid, status
        time.sleep(0.1)


def _child(doc: str, blocks: list[Block], folder: Path, ports: dict[int, int], result_file: Path) -> None:
    code = 0
    try:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a timeout: servers stopped on the way out
        results = run_doc(doc, blocks, folder, ports)
        result_file.write_text(json.dumps(results))
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            import atexit

            atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _spawn(doc: str, blocks: list[Block], folder: Path, ports: dict[int, int], result_file: Path) -> int:
    job = folder / "job.json"
    job.write_text(json.dumps({"doc": doc, "blocks": [b.to_json() for b in blocks],
                               "ports": {str(k): v for k, v in ports.items()}}))
    return subprocess.Popen([sys.executable, __file__, "--doc", str(job), str(result_file)],
                            start_new_session=True).pid


def main_doc(job_path: str, out_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    folder = Path(job_path).parent
    results = run_doc(job["doc"], [Block(**b) for b in job["blocks"]], folder,
                      {int(k): v for k, v in job["ports"].items()})
    Path(out_path).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--doc":
        sys.exit(main_doc(sys.argv[2], sys.argv[3]))
    sys.exit(main(sys.argv[1], sys.argv[2]))
