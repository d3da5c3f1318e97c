"""What the docs show, read as code: blocks of README.md and docs/*.md, what stands in for what, and how
shown output is compared with real output.

``tests/test_docs.py`` runs every fenced block of the docs (``tests/_docrun.py`` does the running); this
module holds **the one table** of what a run on a CPU test machine changes or leaves out
(:data:`SUBSTITUTIONS`, :data:`HUB_MODELS`, :data:`FIXED_PORTS`, :data:`SKIPS`, :data:`FILES`,
:data:`PRELUDE`, :data:`PRELUDE_FOR`, :data:`SETUP`, :data:`SERVICES`, :data:`BACKGROUND`,
:data:`EXIT_STATUS`), the reading of the blocks, and the comparison rules. It imports nothing heavier
than the standard library.

What a block is
  ``python``: run in the doc's one Python namespace (one process per doc, blocks in order); every
  ``test_*`` function it defines is then called, as pytest would. A line ``expr  # <literal>`` claims
  the value of ``expr``. Lines starting ``>>>`` are run as in a doctest and their shown result compared.
  ``bash`` / ``sh`` / ``console``: one command per line (``\\`` continues it, ``#`` starts a comment),
  each run by bash from the doc's working folder, exit status 0 expected (:data:`EXIT_STATUS`);
  ``$ cmd`` lines are a transcript: the lines after each are its output. An untagged or ``text`` block
  whose first line is ``$ ...`` is a transcript too. Every other block (``json``, ``text``, untagged)
  is shown output or a picture, and says which with a comment right before it (below); one that does
  not fails.

Comments right before a block (invisible when rendered)
  ``<!-- doc-test: skip (REASON) -->``            not run: a fragment, a diagram, a synopsis; say why.
  ``<!-- doc-test: continue -->``                 a Python block run together with the Python block before.
  ``<!-- doc-test: output MODE -->``              the output of the runnable block before it.
  ``<!-- doc-test: output MODE of `COMMAND` -->`` the output of COMMAND (as the doc's folder runs it; a
                                                  command the doc ran already is not run again).
  ``<!-- doc-test: stderr MODE [of `COMMAND`] -->`` the same, on standard error.
  ``<!-- doc-test: compare MODE -->``             before a transcript or a ``>>>`` block: its mode.

How output is compared (MODE)
  ``exact``   the text, line by line, trailing spaces and surrounding blank lines aside. For what the
              repository's own fixtures give (reports of ``tests/data``), the same on every machine.
              The default for a transcript.
  ``head``    ``exact`` on the first lines: the shown output is the beginning of the output.
  ``part``    ``exact`` on a run of consecutive lines: the shown output is an excerpt.
  ``masked``  as ``exact`` after masking what differs between machines and runs: version numbers
              (``2.13.0+cpu``), absolute paths, and decimal numbers (``0.0853``, ``1e-05``); integers,
              such as counts, stay compared; runs of spaces are read as one (column widths follow
              the numbers). ``22 of 29`` against ``21 of 28`` fails; ``mean=0.085`` against
              ``mean=0.07`` passes. The folder the docs' programs run in (:data:`SHOWN_FOLDERS`) is
              the doc's working folder, and a path under it is compared as it is.
  ``lines``   ``masked``, integers masked too, and each shown line is found among the actual lines,
              in order (a sample of a program's log).
  ``keys``    a shown value (``>>>`` results, ``json`` blocks, a printed dict): every key shown is
              there with a value of the shown type, recursively; each element of a shown list matches
              an actual element; ``...`` matches anything. Strings and numbers are not compared (the
              values that depend on the machine: devices, paths, timings). The default for ``>>>``.
  A shown value (JSON, or a Python literal) is compared as a value in every mode: ``exact`` compares
  every value, ``masked`` (and ``head``, ``part``, ``lines``) strings masked with integers, ``keys``
  types only; a shown value may also be found inside the output (one finding of a whole report).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# ============================================================================== the table
# Everything a CPU test machine changes in what the docs show is declared here, and only here.

TINY = "tiny"
"""The folder (in each doc's working folder) of the tiny Llama with a trained tokenizer and a chat
template (``tests/serving/_servekit.build_tiny_model``) that stands in for every hub model."""

HUB_MODELS = ("Qwen/Qwen2.5-0.5B-Instruct",)
"""Hub names the docs load: each becomes ``./tiny`` (no downloads here)."""

FIXED_PORTS = (9464, 9561, 9090, 4318, 3000, 8786, 8000)
"""Ports the docs name (8000: ``transformers serve``'s default): each becomes a free port, the same one
throughout a doc."""

SERVICES: dict[int, str] = {
    4318: "an OTLP/HTTP receiver (tests/otlp_receiver.py), for the collector the docs push to",
}
"""Services the docs take as running, started for a doc that names their port."""

SHOWN_FOLDERS = ("/srv/app",)
"""The folder the docs' programs run in, in shown output: compared as the doc's working folder here."""


@dataclasses.dataclass(frozen=True)
class Sub:
    """A textual substitution: ``pattern`` (a regex) becomes ``replacement`` in the code or commands of
    the docs matching ``docs`` (a glob on the doc's path), for the reason ``why``."""

    pattern: str
    replacement: str
    why: str
    docs: str = "*"


SUBSTITUTIONS: tuple[Sub, ...] = (
    Sub(r'device_map="cuda"', 'device_map="cpu"', "cpu for cuda"),
    Sub(r'\.to\("cuda"\)', '.to("cpu")', "cpu for cuda"),
    Sub(r",\s*ProfilerActivity\.CUDA", "", "cpu for cuda: no CUDA activity to record"),
    Sub(r"\bgpuprobe\.serve\(\)", "gpuprobe.serve(port=9464)", "the default port, made free below"),
    Sub(r"\bmodel\.generate\(\.\.\.\)", "model.generate(**inputs, max_new_tokens=8)",
        "`...` stands for the reader's arguments"),
    Sub(r"MeterProvider\(\.\.\.\)", "MeterProvider()", "`...` stands for the reader's exporters"),
    Sub(r'gpuprobe\.profile\("100-150"', 'gpuprobe.profile("2-4"', "a 3-step window: 150 steps are slow on a CPU",
        "docs/profiling.md"),
    Sub(r'Client\("scheduler:8786"\)', "Client(processes=False, n_workers=1, dashboard_address=None)",
        "an in-process Dask cluster for a remote scheduler", "docs/report.md"),
    Sub(r"/shared/run-42/traces/", "traces/", "the run's traces are the fixture folder traces/", "docs/report.md"),
    Sub(r"kill -USR2 <pid>", "kill -USR2 $GPUPROBE_DOCS_SERVER_PID",
        "<pid> is the server started earlier in the same doc"),
    Sub(r"--requests 100000", "--requests 100000 --max-new-tokens 4 --port 9464",
        "shorter requests (the server only has to come up), on the default port, made free below"),
    Sub(r"\bgpuprobe run -- ", "gpuprobe run --port 9464 -- ", "gpuprobe run's default port, made free below"),
    Sub(r"\btransformers serve\b", "transformers serve --port 8000",
        "transformers serve's own port (8000 by default), named so that it is made free"),
    Sub(r"/srv/app/gpuprobe-traces/gpuprobe-steps-[\w.-]+\.json(\.gz)?", '"$GPUPROBE_DOCS_TRACE"',
        "the trace the capture answered above names (the command waits until it is written)", "docs/capture.md"),
)


@dataclasses.dataclass(frozen=True)
class Skip:
    """A command (shell) or block (Python) matching ``pattern`` is not run, for the reason ``why``."""

    pattern: str
    why: str
    kind: str = "shell"  # "shell": a command; "python": a whole Python block


SKIPS: tuple[Skip, ...] = (
    Skip(r"^(sudo )?(python -m )?(pip|pip3|apt-get|brew) (install|download)\b",
         "installs packages (the test runs in the installed checkout)"),
    Skip(r"^python -m pip install\b", "installs packages (the test runs in the installed checkout)"),
    Skip(r"^bash scripts/demo\b", "set-up: installs into .venv when pyproject.toml changed; "
         "the demo itself runs in docs/grafana.md and tests/transformers/test_demo_and_examples.py"),
    Skip(r"^bash scripts/test\b", "runs the whole test suite, this test included"),
    Skip(r"^bash scripts/test-gpu-mode\b|pytest --simulate-gpu|GPUPROBE_TEST_SIMULATE_GPU=\d+ .*pytest",
         "runs the test suite under the simulated GPU (minutes); CI runs it"),
    Skip(r"^(PYTHONPATH=\S+ )?scripts/gpu-check\b", "the GPU machine's check (needs an NVIDIA GPU; the dry run "
         "writes benchmarks/RESULTS-gpu.*); tests/test_gpu_check.py runs its dry run"),
    Skip(r"(^|\s)nsys\s", "needs Nsight Systems (nsys) and a GPU"),
    Skip(r"(^|\s|\$\()ncu\s", "needs Nsight Compute (ncu) and a GPU"),
    Skip(r"^docker\s", "needs a container runtime and images from a registry"),
    Skip(r"^otelcol-contrib\b", "needs the OpenTelemetry Collector (contrib) binary"),
    Skip(r"^export (GPUPROBE_OTLP_ENDPOINT|OTEL_RESOURCE_ATTRIBUTES)=", "set-up of the collector pipeline "
         "skipped above (tests/test_otlp.py pushes to a real receiver)"),
    Skip(r"^prometheus\s", "a Prometheus server fed for minutes (tests/monitoring/ runs this set-up: the "
         "shipped configuration, rules and every panel query against a real Prometheus)"),
    Skip(r"dashboard --verify http", "needs a Prometheus that has scraped for minutes (tests/monitoring/)"),
    Skip(r"plot_from_prometheus\.py", "needs a Prometheus that has scraped for minutes (tests/monitoring/ "
         "runs the plot against a real Prometheus)"),
    Skip(r"(--executor |DASK_SCHEDULER_ADDRESS=)\w+://scheduler\b", "a Dask scheduler on another host "
         "(tests/report/test_executors.py runs the command against a scheduler and two workers)"),
    Skip(r"^torchrun --nproc_per_node=8\b", "8 processes, each on its own GPU with NCCL"),
    Skip(r"^GPUPROBE_NVML=1\b", "needs an NVIDIA driver (NVML); tests/test_nvml.py runs the simulated NVML"),
    Skip(r"torch\.cuda\.set_device|init_process_group\(\"nccl\"\)",
         "a GPU per rank and NCCL (torchrun on GPUs)", kind="python"),
    Skip(r"gpuprobe\.memory\.(record_history|snapshot)\(",
         "CUDA memory snapshots need a GPU (tests/test_config_and_memory.py runs them on the simulated CUDA)",
         kind="python"),
)

EXIT_STATUS: tuple[tuple[str, frozenset[int], str], ...] = (
    (r"--fail-on\b", frozenset({0, 3}), "exit 3 when a finding of that severity or worse is found"),
)
"""Commands whose documented exit status may be other than 0: (pattern, statuses, why)."""


BACKGROUND = (r"\btransformers serve\b", r"\bgpuprobe demo --requests 100000\b", r"serve\.py --requests 100000")
"""Commands that serve until stopped: started in the background, ready once what they serve answers
(:func:`ready_urls`), stopped when their doc ends. ``$GPUPROBE_DOCS_SERVER_PID`` is the last one's."""


FILES: dict[str, str] = {
    # name in the docs: what stands for it in each doc's working folder
    "tests/data": "the repository's tests/data (read-only)",
    "examples": "the repository's examples/ (read-only)",
    "deploy": "a copy of the repository's deploy/ (commands rewrite it)",
    "docs/img": "an empty folder (pictures commands draw)",
    "tiny": "the tiny Llama (tests/serving/_servekit.build_tiny_model)",
    "serve.py": "a server stand-in: the tiny Llama, instrumented, 8 requests of 24 tokens, one decode step "
                "slow (0.3 s, a busy moment); --requests N for more",
    "app.py": "a program you do not own: the tiny Llama through transformers alone, 2 requests",
    "mylib.py": "a library whose run() generates with the instrumented tiny Llama",
    "decode.json.gz": "a kineto trace: a profile window of the tiny Llama's decode steps, recorded here",
    "dynamic.json.gz": "tests/report/test_findings_shapes.experiment('dynamic') (the docs' run A)",
    "static.json.gz": "tests/report/test_findings_shapes.experiment('static')",
    "a_dynamic.json": "tests/report/test_findings_shapes.experiment('dynamic')",
    "b_graph.json": "tests/report/test_findings_shapes.experiment('graph')",
    "before.json.gz": "tests/report/test_findings_shapes.experiment('dynamic')",
    "after.json.gz": "tests/report/test_findings_shapes.experiment('graph')",
    "decode.sqlite": "tests/data/nsys/fuser_cross_entropy_h200.sqlite.xz, decompressed",
    "kernels.csv": "tests/data/ncu/microgpusim_vectoradd_gtx1080_raw.csv",
    "decode.csv": "tests/data/ncu/microgpusim_vectoradd_gtx1080_raw.csv",
    "details.csv": "tests/data/ncu/esmm_sgemm_a10g_details.csv",
    "before.csv": "tests/data/ncu/esmm_sgemm_a10g_details.csv",
    "after.csv": "tests/data/ncu/llmperfopt_kernel0001_rtx5090_details.csv",
    "kernel_1/ncu.details.csv": "tests/data/ncu/esmm_sgemm_a10g_details.csv",
    "kernel_2/ncu.details.csv": "tests/data/ncu/llmperfopt_kernel0001_rtx5090_details.csv",
    "traces": "tests/data/kineto/param_dlrm_8rank (eight ranks)",
    "before": "tests/data/kineto/param_dlrm_8rank",
    "after": "tests/data/kineto/param_dlrm_8rank",
    "rank0.json.gz": "tests/data/kineto/param_dlrm_8rank/rank-0.json.gz",
    "rank1.json.gz": "tests/data/kineto/param_dlrm_8rank/rank-1.json.gz",
}
"""Files the docs name as the reader's own, and what stands for each (made by ``tests/_docrun.py``)."""

PRELUDE = '''
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from opentelemetry.sdk.metrics import MeterProvider
import gpuprobe
from gpuprobe import probe as _probe

torch.manual_seed(0)
tokenizer = AutoTokenizer.from_pretrained("tiny")      # "the reader's model": the tiny Llama
model = AutoModelForCausalLM.from_pretrained("tiny").eval()
inputs = tokenizer(["The GPU is"], return_tensors="pt")
ids = inputs["input_ids"]
my_meter_provider = MeterProvider()                      # "your OpenTelemetry SDK pipeline"

def load_model():
    return model

@_probe
def my_step():                                           # "your code", probed
    return model(ids).logits[:, -1].argmax(-1)
'''
"""Names the Python blocks take as given, defined before a doc's first Python block (torch and
transformers are imported once, before any doc runs)."""

PRELUDE_FOR: dict[str, str] = {
    "docs/sync-audit.md": '''
from gpuprobe.integrations.transformers import instrument as _instrument
gpuprobe.configure(sync_audit=1)      # the audited run the shown sync sites come from
_instrument(model, model_name="tiny-llama").generate(**inputs, max_new_tokens=3)
''',
    "docs/utilization.md": '''
from gpuprobe.integrations.transformers import instrument as _instrument
_llama = _instrument(AutoModelForCausalLM.from_pretrained("tiny").eval(), model_name="llama-4x512")  # its name
''',
    "docs/capture.md": '''
import runpy as _runpy
gpuprobe.configure(profile_slow_step="p99", collect_interval=0.05)
_runpy.run_path("serve.py", run_name="__main__")      # the server the doc reads info() in: one slow step
''',
}
"""What a doc's shown results come from, run after :data:`PRELUDE` (the state its prose describes)."""

SETUP: dict[str, tuple[str, ...]] = {
    "docs/capture.md": ("GPUPROBE_PROMETHEUS_PORT=9464 python serve.py --requests 100000",),
}
"""Servers a doc's commands talk to that the doc does not start: run in the background (ready when
their ``/metrics`` answers) before its first block, stopped after its last."""

# ============================================================================== reading the docs

DOCS_GLOBS = ("README.md", "docs/*.md")
_DIRECTIVE = re.compile(r"^\s*<!--\s*doc-test:\s*(.*?)\s*-->\s*$")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
PYTHON_LANGS = {"python", "py", "python3", "pycon"}
TEXT_LANGS = {"", "text", "txt", "json", "output"}


@dataclasses.dataclass
class Block:
    """One fenced block: the doc (relative to the repository), the line of its opening fence, its
    language, its text, and the ``doc-test`` comment right before it (or "")."""

    doc: str
    line: int
    lang: str
    text: str
    directive: str = ""

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def kind(self) -> str:
        """``python``, ``doctest``, ``shell``, ``transcript``, ``output``, ``skip``, ``continue`` or
        ``unclassified`` (a block of text that says neither what it is the output of nor why it is
        not run)."""
        d = self.directive
        if d.startswith("skip"):
            return "skip"
        if d.startswith("output") or d.startswith("stderr"):
            return "output"
        if self.lang in PYTHON_LANGS:
            if any(line.lstrip().startswith(">>>") for line in self.text.splitlines()):
                return "doctest"
            return "continue" if d == "continue" else "python"
        first = next((line for line in self.text.splitlines() if line.strip()), "")
        if self.lang in SHELL_LANGS:
            return "transcript" if first.startswith("$ ") else "shell"
        if first.startswith("$ "):
            return "transcript"
        return "unclassified"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def doc_paths(root: Path = ROOT) -> list[Path]:
    out: list[Path] = []
    for pattern in DOCS_GLOBS:
        out.extend(sorted(root.glob(pattern)))
    return out


def read_blocks(path: Path, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of one Markdown file, each with the ``doc-test`` comment right before it."""
    rel = path.relative_to(root).as_posix() if path.is_absolute() and path.is_relative_to(root) else str(path)
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence[0] * len(fence))
                                      and lines[j].strip().strip(fence[0]) == ""):
            j += 1
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1:j]]
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        d = _DIRECTIVE.match(lines[k]) if k >= 0 else None
        blocks.append(Block(rel, i + 1, lang, "\n".join(body), d.group(1) if d else ""))
        i = j + 1
    return blocks


def all_blocks(root: Path = ROOT) -> list[Block]:
    return [b for p in doc_paths(root) for b in read_blocks(p, root)]


@dataclasses.dataclass
class Output:
    """What an ``output`` comment says: compare MODE against the output of COMMAND (or of the block before)."""

    mode: str
    command: str | None
    stream: str  # "stdout" or "stderr"


MODES = ("exact", "head", "part", "masked", "lines", "keys")
_OUTPUT = re.compile(r"^(output|stderr)(?:\s+(exact|head|part|masked|lines|keys))?(?:\s+of\s+`([^`]+)`)?\s*$")


def parse_output_directive(directive: str) -> Output:
    m = _OUTPUT.match(directive)
    if not m:
        raise ValueError(f"not an output comment: {directive!r} (expected `output MODE` or `output MODE of `COMMAND``)")
    return Output(m.group(2) or "exact", m.group(3), "stderr" if m.group(1) == "stderr" else "stdout")


def compare_mode(block: Block, default: str) -> str:
    """The mode a transcript or a ``>>>`` block is compared in: ``<!-- doc-test: compare MODE -->``, or ``default``."""
    m = re.match(r"^compare\s+(\w+)\s*$", block.directive)
    if not m:
        return default
    if m.group(1) not in MODES:
        raise ValueError(f"no comparison {m.group(1)!r}: one of {', '.join(MODES)}")
    return m.group(1)


def skip_reason(directive: str) -> str:
    m = re.match(r"^skip\s*\((.+)\)\s*$", directive, re.S)
    if not m:
        raise ValueError(f"a skip says why: `<!-- doc-test: skip (REASON) -->`, got {directive!r}")
    return m.group(1).strip()


# ============================================================================== shell commands

@dataclasses.dataclass
class Command:
    """One shell command of a block: its text (continuations joined, comment dropped), the line of the
    block it starts on (0-based), and for a transcript the output shown after it."""

    text: str
    offset: int
    shown: str | None = None


def strip_comment(line: str) -> str:
    """The line without a trailing ``# comment`` (a ``#`` that starts a word outside quotes, as bash reads it)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
            elif ch == "\\" and quote == '"':
                continue
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def shell_commands(block: Block) -> list[Command]:
    lines = block.text.split("\n")
    transcript = block.kind == "transcript"
    out: list[Command] = []
    i = 0
    while i < len(lines):
        raw = lines[i]
        if transcript and not raw.startswith("$ "):
            i += 1
            continue
        start = i
        text = raw[2:] if transcript else raw
        text = strip_comment(text)
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1].rstrip() + " " + strip_comment(lines[i].strip())
        i += 1
        if not text.strip():
            continue
        shown = None
        if transcript:
            j = i
            while j < len(lines) and not lines[j].startswith("$ "):
                j += 1
            shown = "\n".join(lines[i:j])
            i = j
        out.append(Command(text.strip(), start, shown))
    return out


# ============================================================================== substitutions

def substitute(text: str, doc: str, ports: dict[int, int], model_dir: str = "./" + TINY) -> str:
    """The code or command ``text`` of ``doc`` as it runs here: the table's substitutions, hub names
    and fixed ports."""
    import fnmatch

    for sub in SUBSTITUTIONS:
        if fnmatch.fnmatch(doc, sub.docs):
            text = re.sub(sub.pattern, sub.replacement, text)
    for name in HUB_MODELS:
        text = text.replace(name, model_dir)
    for fixed, free in ports.items():
        text = re.sub(rf"(?<![\d.]){fixed}(?!\d)", str(free), text)
    return text


def skip_for(text: str, kind: str) -> str | None:
    for rule in SKIPS:
        if rule.kind == kind and re.search(rule.pattern, text, re.M):
            return rule.why
    return None


def exit_statuses(command: str) -> frozenset[int]:
    for pattern, statuses, _why in EXIT_STATUS:
        if re.search(pattern, command):
            return statuses
    return frozenset({0})


def ready_urls(command: str, ports: dict[int, int]) -> list[str] | None:
    """The URLs that say a serving command is up (its ports already made free), or None to run it to its end."""
    if not any(re.search(p, command) for p in BACKGROUND):
        return None
    urls = []
    if re.search(r"\bgpuprobe (run|demo)\b|GPUPROBE_PROMETHEUS_PORT=", command):
        m = re.search(r"\bgpuprobe (?:run|demo)\b(?:(?! -- ).)*?--port (\d+)|GPUPROBE_PROMETHEUS_PORT=(\d+)", command)
        port = (m.group(1) or m.group(2)) if m else ports.get(9464, 9464)
        urls.append(f"http://127.0.0.1:{port}/metrics")
    m = re.search(r"\btransformers serve --port (\d+)", command)
    if m:
        urls.append(f"http://127.0.0.1:{m.group(1)}/v1/models")
    return urls


# ============================================================================== comparing output

_VERSION = re.compile(r"(?<![\w.])v?\d+\.\d+\.\d+(?:[.+-]?[A-Za-z0-9]+)*(?![\w.])")
_PATH = re.compile(r"(?<![\w.>])(?:\.\.\.|~)?(?:/[\w.+@-]+)+/?")
_DECIMAL = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])|(?<![\w.])\d+[eE][-+]?\d+(?![\w.])")
_INTEGER = re.compile(r"(?<![\w.])\d+(?![\w.])")


def mask(text: str, integers: bool = False) -> str:
    """``text`` with versions, absolute paths and decimal numbers masked (and integers, if asked: as
    numbers, since a measured value printed to three significant digits can come out whole, ``13 ms``
    where a doc shows ``12.9 ms``), runs of spaces read as one. A path under the working folder
    (``<cwd>/...``) stays as it is."""
    text = _VERSION.sub("<version>", text)
    text = _PATH.sub("<path>", text)
    text = _DECIMAL.sub("<num>", text)
    if integers:
        text = _INTEGER.sub("<num>", text)
    return re.sub(r"[ \t]+", " ", text)


def with_folder(shown: str, actual: str, folder: str | None) -> tuple[str, str]:
    """Both texts with the working folder written ``<cwd>``: the docs' folder (:data:`SHOWN_FOLDERS`) in
    the shown one, this run's in the actual one."""
    for name in SHOWN_FOLDERS:
        shown = shown.replace(name, "<cwd>")
    if folder:
        actual = actual.replace(folder.rstrip("/"), "<cwd>")
    return shown, actual


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def compare_text(shown: str, actual: str, mode: str, folder: str | None = None) -> str | None:
    """None when ``actual`` is what ``shown`` shows under ``mode``; else what differs, first difference first."""
    shown, actual = with_folder(shown, actual, folder)
    want, got = _lines(shown), _lines(actual)
    if mode == "lines":
        sample = [mask(line, integers=True).strip() for line in want]
        log = [mask(line, integers=True).strip() for line in got]
        k = 0
        for line in sample:
            while k < len(log) and log[k] != line:
                k += 1
            if k == len(log):
                return f"no line like {line!r} (in order) in the output:\n" + "\n".join(got[-40:])
            k += 1
        return None
    if mode == "masked":
        want = [mask(line).strip() for line in want]
        got = [mask(line).strip() for line in got]
    elif mode == "head":
        got = got[:len(want)]
    elif mode == "part":
        for k in range(len(got) - len(want) + 1):
            if got[k:k + len(want)] == want:
                return None
        first = next((k for k, line in enumerate(got) if want and line == want[0]), None)
        if first is None:
            return f"no line {want[0]!r} in the output:\n" + "\n".join(got[:60]) if want else None
        got = got[first:first + len(want)]
    elif mode != "exact":
        raise ValueError(f"no text comparison {mode!r}")
    if want == got:
        return None
    for n, (w, g) in enumerate(zip(want, got)):
        if w != g:
            return f"line {n + 1} of the shown output differs:\n  shown:  {w}\n  actual: {g}"
    if len(want) > len(got):
        return f"the output ends before the shown line {len(got) + 1}: {want[len(got)]!r}"
    return f"the output goes on after the shown {len(want)} lines: {got[len(want)]!r}"


def parse_value(text: str) -> Any:
    """A shown value: JSON, or a Python literal where ``...`` stands for anything."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    return ast.literal_eval(text.strip())


def compare_value(shown: Any, actual: Any, mode: str = "keys", where: str = "", folder: str | None = None) -> str | None:
    """None when ``actual`` has the shape ``shown`` shows; else where it differs. ``keys``: keys and
    types; ``masked``: strings too, compared masked (integers included); ``exact``: every value."""
    here = where or "the value"
    if shown is Ellipsis:
        return None
    if isinstance(shown, dict):
        if not isinstance(actual, dict):
            return f"{here}: shown a dict, got {type(actual).__name__} {actual!r:.200}"
        for key, value in shown.items():
            if key not in actual:
                return f"{here}: no key {key!r} (keys: {sorted(map(str, actual))})"
            problem = compare_value(value, actual[key], mode, f"{here}[{key!r}]", folder)
            if problem:
                return problem
        return None
    if isinstance(shown, (list, tuple)):
        if not isinstance(actual, (list, tuple)):
            return f"{here}: shown a list, got {type(actual).__name__} {actual!r:.200}"
        if list(shown) == [Ellipsis]:
            return None
        if not shown and actual and mode == "exact":
            return f"{here}: shown empty, got {len(actual)} elements"
        for n, element in enumerate(shown):
            if element is Ellipsis:
                continue
            problems = [compare_value(element, a, mode, f"{here}[{n}]", folder) for a in actual]
            if not problems:
                return f"{here}: shown {len(shown)} elements, got none"
            if not any(p is None for p in problems):
                return problems[0] if len(actual) == 1 else f"{here}[{n}]: no element like {element!r:.200} in {actual!r:.300}"
        return None
    if shown is None or isinstance(shown, bool):
        if shown is None and mode != "exact":
            return None  # "none yet" where the doc's run had none: any value
        return None if actual is shown else f"{here}: shown {shown!r}, got {actual!r}"
    if isinstance(shown, (int, float)):
        if isinstance(actual, bool) or not isinstance(actual, (int, float)) and actual is not None:
            return f"{here}: shown a number, got {actual!r:.200}"
        if mode == "exact" and actual != shown:
            return f"{here}: shown {shown!r}, got {actual!r}"
        return None
    if isinstance(shown, str):
        if not isinstance(actual, str):
            return f"{here}: shown a string, got {actual!r:.200}"
        if mode == "exact" and actual != shown:
            return f"{here}: shown {shown!r}, got {actual!r}"
        if mode == "masked":
            s, a = with_folder(shown, actual, folder)
            if mask(s, integers=True) != mask(a, integers=True):
                return f"{here}: shown {shown!r}, got {actual!r}"
        return None
    return None if shown == actual else f"{here}: shown {shown!r}, got {actual!r}"


def find_value(shown: Any, actual: Any, mode: str = "keys", folder: str | None = None) -> bool:
    """Whether ``shown`` matches ``actual`` or a value inside it (a shown finding of a whole JSON report)."""
    if compare_value(shown, actual, mode, folder=folder) is None:
        return True
    if isinstance(actual, dict):
        return any(find_value(shown, v, mode, folder) for v in actual.values())
    if isinstance(actual, (list, tuple)):
        return any(find_value(shown, v, mode, folder) for v in actual)
    return False
