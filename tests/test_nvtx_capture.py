"""NVTX capture through a real injection library, driven by the real ``nvtx`` package in subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuprobe.testing.nvtx_capture import (
    CAPTURE_FILE_ENV,
    INJECTION_PATH_ENV,
    NvtxCapture,
    NvtxCaptureError,
    NvtxEvent,
    build_injection_library,
    capture_env,
    nvtx_include_dir,
    parse_capture,
    run_captured,
)


@pytest.fixture(scope="session")
def nvtx_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The injection library, compiled once per session into a fresh directory."""
    if shutil.which(os.environ.get("CC") or "gcc") is None:
        pytest.skip("no C compiler (gcc) to build the NVTX injection library")
    return build_injection_library(tmp_path_factory.mktemp("nvtx-inject"))


@pytest.fixture
def capture(nvtx_lib: Path):
    """``capture(code) -> NvtxCapture`` with the real ``nvtx`` package."""
    pytest.importorskip("nvtx")

    def run(code: str, **kwargs) -> NvtxCapture:
        return run_captured(code, library=nvtx_lib, timeout=60, **kwargs)

    return run


def pushes_and_pops(cap: NvtxCapture, domain: str | None, thread: int | None = None) -> list[tuple]:
    return [
        (e.kind, e.message, e.depth)
        for e in cap.filter(("push", "pop"), domain=domain, thread=thread)
    ]


# --------------------------------------------------------------------------- build


def test_build_is_cached_by_content(nvtx_lib: Path) -> None:
    assert nvtx_lib.is_file()
    assert nvtx_lib.name.startswith("libgpuprobe_nvtx_inject-") and nvtx_lib.suffix == ".so"
    mtime = nvtx_lib.stat().st_mtime_ns
    again = build_injection_library(nvtx_lib.parent)
    assert again == nvtx_lib
    assert again.stat().st_mtime_ns == mtime
    assert [p.name for p in nvtx_lib.parent.iterdir()] == [nvtx_lib.name]  # no temp files left behind


def test_build_exports_the_nvtx_entry_point(nvtx_lib: Path) -> None:
    import ctypes

    lib = ctypes.CDLL(str(nvtx_lib))
    assert hasattr(lib, "InitializeInjectionNvtx2")


def test_build_without_compiler_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NvtxCaptureError, match="not found.*gcc"):
        build_injection_library(tmp_path, compiler="gpuprobe-no-such-cc")


def test_build_without_headers_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPROBE_NVTX_INCLUDE", str(tmp_path))
    with pytest.raises(NvtxCaptureError, match="nvToolsExt.h"):
        build_injection_library(tmp_path / "cache")


def test_vendored_headers_are_found() -> None:
    inc = nvtx_include_dir()
    assert (inc / "nvtx3" / "nvToolsExt.h").is_file()
    assert (inc / "nvtx3" / "nvtxDetail" / "nvtxTypes.h").is_file()


def test_capture_env_names_the_library_and_file(nvtx_lib: Path, tmp_path: Path) -> None:
    env = capture_env(tmp_path / "x.jsonl", nvtx_lib)
    assert env == {INJECTION_PATH_ENV: str(nvtx_lib.resolve()), CAPTURE_FILE_ENV: str(tmp_path / "x.jsonl")}


# --------------------------------------------------------------------------- real nvtx package


def test_domain_push_pop_nested(capture) -> None:
    cap = capture(
        """
        import nvtx
        d = nvtx.get_domain("gpuprobe")
        assert type(d).__name__ == "Domain", type(d)
        d.push_range(message="step")
        d.push_range(message="forward")
        d.push_range(message="attn")
        d.pop_range()
        d.pop_range()
        d.push_range(message="backward")
        d.pop_range()
        d.pop_range()
        """
    )
    assert cap.attached
    assert [e.domain for e in cap.filter("domain_create")] == ["gpuprobe"]
    assert pushes_and_pops(cap, "gpuprobe") == [
        ("push", "step", 0),
        ("push", "forward", 1),
        ("push", "attn", 2),
        ("pop", None, 2),
        ("pop", None, 1),
        ("push", "backward", 1),
        ("pop", None, 1),
        ("pop", None, 0),
    ]
    ranges = cap.ranges("gpuprobe")
    assert [r.path for r in ranges] == [
        ("step",),
        ("step", "forward"),
        ("step", "forward", "attn"),
        ("step", "backward"),
    ]
    assert [r.parent for r in ranges] == [None, 0, 1, 0]
    assert [r.depth for r in ranges] == [0, 1, 2, 1]
    assert all(r.closed and r.duration_ns >= 0 for r in ranges)
    assert ranges[0].start_ts <= ranges[1].start_ts <= ranges[2].start_ts
    assert ranges[0].end_ts >= ranges[3].end_ts
    assert cap.names("gpuprobe") == ["step", "forward", "attn", "backward"]
    assert cap.is_balanced()
    assert len(cap.threads()) == 1


def test_registered_strings_resolve_per_domain(capture) -> None:
    cap = capture(
        """
        import nvtx
        d = nvtx.get_domain("gpuprobe")
        other = nvtx.get_domain("other")
        attrs = d.get_event_attributes(message="decode")
        for _ in range(2):
            d.push_range(attrs)
            d.pop_range()
        other.push_range(message="decode")
        other.pop_range()
        """
    )
    regs = [(e.domain, e.message) for e in cap.filter("register_string")]
    assert regs == [("gpuprobe", "decode"), ("other", "decode")]
    pushes = cap.filter("push")
    assert [(e.domain, e.message, e.message_type) for e in pushes] == [
        ("gpuprobe", "decode", "registered"),
        ("gpuprobe", "decode", "registered"),
        ("other", "decode", "registered"),
    ]
    assert cap.names("gpuprobe") == ["decode", "decode"]
    assert cap.names("other") == ["decode"]
    assert cap.domains() == ["gpuprobe", "other"]


def test_categories_with_names(capture) -> None:
    cap = capture(
        """
        import nvtx
        d = nvtx.get_domain("gpuprobe")
        other = nvtx.get_domain("other")
        d.push_range(message="load", category="io")
        d.pop_range()
        d.push_range(message="matmul", category="compute")
        d.pop_range()
        d.push_range(message="load", category="io")
        d.pop_range()
        d.push_range(message="raw", category=9)
        d.pop_range()
        other.mark(message="tick", category="net")
        """
    )
    named = [(e.domain, e.category, e.category_name) for e in cap.filter("name_category")]
    assert named == [("gpuprobe", 1, "io"), ("gpuprobe", 2, "compute"), ("other", 1, "net")]
    assert [(r.message, r.category, r.category_name) for r in cap.ranges("gpuprobe")] == [
        ("load", 1, "io"),
        ("matmul", 2, "compute"),
        ("load", 1, "io"),
        ("raw", 9, None),
    ]
    (mark,) = cap.filter("mark")
    assert (mark.domain, mark.message, mark.category, mark.category_name) == ("other", "tick", 1, "net")


def test_int_and_float_payloads(capture) -> None:
    cap = capture(
        """
        import nvtx
        d = nvtx.get_domain("gpuprobe")
        for p in (42, -7, 2**62, 2.5, 0.1, float("inf")):
            d.push_range(message="p", payload=p)
            d.pop_range()
        d.push_range(message="none")
        d.pop_range()
        """
    )
    got = [(r.payload, r.payload_type) for r in cap.ranges("gpuprobe")]
    assert got == [
        (42, "int64"),
        (-7, "int64"),
        (2**62, "int64"),
        (2.5, "double"),
        (0.1, "double"),
        (float("inf"), "double"),
        (None, None),
    ]
    assert type(got[0][0]) is int and type(got[3][0]) is float


def test_two_threads_keep_separate_balanced_sequences(capture) -> None:
    cap = capture(
        """
        import json, threading, nvtx
        d = nvtx.get_domain("gpuprobe")
        barrier = threading.Barrier(2)
        ids = {}
        def work(name):
            ids[name] = threading.get_native_id()
            barrier.wait()
            for i in range(200):
                d.push_range(message=name + ".outer")
                d.push_range(message=name + ".inner", payload=i)
                d.pop_range()
                d.pop_range()
        threads = [threading.Thread(target=work, args=(n,)) for n in ("a", "b")]
        for t in threads: t.start()
        for t in threads: t.join()
        print(json.dumps(ids))
        """
    )
    ids = json.loads(cap.stdout)
    assert ids["a"] != ids["b"]
    assert set(cap.threads("gpuprobe")) == {ids["a"], ids["b"]}
    for name in ("a", "b"):
        expected = [
            ("push", f"{name}.outer", 0),
            ("push", f"{name}.inner", 1),
            ("pop", None, 1),
            ("pop", None, 0),
        ] * 200
        assert pushes_and_pops(cap, "gpuprobe", thread=ids[name]) == expected
        inner = [r for r in cap.ranges("gpuprobe") if r.thread == ids[name] and r.depth == 1]
        assert [r.payload for r in inner] == list(range(200))
        assert all(r.path == (f"{name}.outer", f"{name}.inner") for r in inner)
    assert cap.is_balanced(), cap.problems()
    assert len(cap.ranges("gpuprobe")) == 800


def test_annotate_pops_when_the_function_raises(capture) -> None:
    cap = capture(
        """
        import contextlib, nvtx

        @nvtx.annotate("risky", domain="gpuprobe", category="errors", payload=7)
        def risky():
            with nvtx.annotate("inside", domain="gpuprobe"):
                raise ValueError("boom")

        @nvtx.annotate(domain="gpuprobe")
        def named_after_function():
            pass

        try:
            risky()
        except ValueError:
            print("caught")
        with contextlib.suppress(KeyError):
            with nvtx.annotate("ctx", domain="gpuprobe"):
                raise KeyError("k")
        named_after_function()
        """
    )
    assert cap.stdout.strip() == "caught"
    assert pushes_and_pops(cap, "gpuprobe") == [
        ("push", "risky", 0),
        ("push", "inside", 1),
        ("pop", None, 1),
        ("pop", None, 0),
        ("push", "ctx", 0),
        ("pop", None, 0),
        ("push", "named_after_function", 0),
        ("pop", None, 0),
    ]
    risky = cap.ranges("gpuprobe")[0]
    assert (risky.category_name, risky.payload) == ("errors", 7)
    assert cap.is_balanced()


def test_default_domain(capture) -> None:
    cap = capture(
        """
        import nvtx
        nvtx.push_range("x")
        nvtx.push_range("y", payload=1)
        nvtx.pop_range()
        nvtx.pop_range()
        nvtx.mark("m")
        """
    )
    assert cap.filter("domain_create") == []
    assert pushes_and_pops(cap, "") == [("push", "x", 0), ("push", "y", 1), ("pop", None, 1), ("pop", None, 0)]
    assert [r.path for r in cap.ranges("")] == [("x",), ("x", "y")]
    assert [(e.domain, e.message) for e in cap.filter("mark")] == [("", "m")]
    assert cap.domains() == [""]


def test_start_end_range_across_threads(capture) -> None:
    cap = capture(
        """
        import threading, nvtx
        d = nvtx.get_domain("gpuprobe")
        rid = d.start_range(message="async", payload=3)
        t = threading.Thread(target=d.end_range, args=(rid,))
        t.start(); t.join()
        """
    )
    starts, ends = cap.filter("range_start"), cap.filter("range_end")
    assert len(starts) == len(ends) == 1 and starts[0].range_id == ends[0].range_id
    (r,) = cap.start_end_ranges("gpuprobe")
    assert (r.message, r.payload, r.closed) == ("async", 3, True)
    assert r.end_thread != r.thread
    assert cap.ranges() == []


def test_forked_children_record_with_their_own_pid(capture) -> None:
    cap = capture(
        """
        import os, threading, nvtx
        d = nvtx.get_domain("gpuprobe")
        d.push_range(message="parent")
        stop = threading.Event()
        def spam():  # writes while forking: the child must not inherit a held lock
            while not stop.is_set():
                d.mark(message="spam")
        t = threading.Thread(target=spam)
        t.start()
        pids = []
        for _ in range(5):
            pid = os.fork()
            if pid == 0:
                d.push_range(message="child")
                d.pop_range()
                d.pop_range()  # closes the child's copy of "parent"
                os._exit(0)
            pids.append(pid)
        for pid in pids:
            os.waitpid(pid, 0)
        stop.set()
        t.join()
        d.pop_range()
        print(os.getpid(), *pids)
        """
    )
    parent, *children = map(int, cap.stdout.split())
    assert {e.pid for e in cap.filter(("push", "pop"))} == {parent, *children}
    for child in children:
        seq = [(e.kind, e.message, e.depth) for e in cap.filter(("push", "pop")) if e.pid == child]
        assert seq == [("push", "child", 1), ("pop", None, 1), ("pop", None, 0)]
        assert {e.thread for e in cap.events if e.pid == child} == {child}
    assert [(r.message, r.pid) for r in cap.ranges("gpuprobe") if r.message == "parent"] == [("parent", parent)]
    assert cap.is_balanced(), cap.problems()


def test_without_capture_nvtx_gives_a_dummy_domain() -> None:
    pytest.importorskip("nvtx")
    env = {k: v for k, v in os.environ.items() if k not in (INJECTION_PATH_ENV, CAPTURE_FILE_ENV)}
    out = subprocess.run(
        [sys.executable, "-c", "import nvtx; print(type(nvtx.get_domain('gpuprobe')).__name__)"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )
    assert out.stdout.strip() == "DummyDomain"


def test_failed_code_raises_with_stderr(capture) -> None:
    with pytest.raises(NvtxCaptureError, match="status 3(.|\n)*marker-on-stderr") as info:
        capture("import sys; sys.stderr.write('marker-on-stderr'); sys.exit(3)")
    assert info.value.returncode == 3
    assert "marker-on-stderr" in info.value.stderr


def test_torch_cuda_nvtx(capture) -> None:
    pytest.importorskip("torch")
    cap = capture(
        """
        import json, torch
        try:
            levels = [torch.cuda.nvtx.range_push("outer"), torch.cuda.nvtx.range_push("inner"),
                      torch.cuda.nvtx.range_pop(), torch.cuda.nvtx.range_pop()]
            torch.cuda.nvtx.mark("tick")
        except RuntimeError as exc:
            print(json.dumps({"error": str(exc)}))
        else:
            print(json.dumps({"levels": levels}))
        """
    )
    result = json.loads(cap.stdout)
    if "error" in result:
        # CPU builds of torch ship no NVTX: the error must say so rather than fail silently.
        assert "NVTX" in result["error"] or "CUDA" in result["error"], result["error"]
        pytest.skip(f"torch.cuda.nvtx unavailable in this torch build: {result['error']}")
    assert result["levels"] == [0, 1, 1, 0]
    assert pushes_and_pops(cap, "") == [
        ("push", "outer", 0), ("push", "inner", 1), ("pop", None, 1), ("pop", None, 0)
    ]
    assert [e.message_type for e in cap.filter("push", domain="")] == ["ascii", "ascii"]
    assert [e.message for e in cap.filter("mark", domain="")] == ["tick"]


# --------------------------------------------------------------------------- C API driven directly

# Plays the NVTX runtime's side of the injection protocol with ctypes: hands the library an
# export table, collects the function pointers it installs and calls them like NVTX would.
_RUNTIME_HARNESS = r"""
import ctypes as C, json, sys
lib = C.CDLL(sys.argv[1])
CORE_SIZE, CORE2_SIZE = 16, 16
slots = {1: (C.c_void_p * (CORE_SIZE + 1))(), 5: (C.c_void_p * (CORE2_SIZE + 1))()}
tables = {}
for mod, s in slots.items():
    t = (C.c_void_p * (len(s) + 1))()
    for i in range(1, len(s) - 1):
        t[i] = C.addressof(s) + i * C.sizeof(C.c_void_p)
    tables[mod] = t

GMFT = C.CFUNCTYPE(C.c_int, C.c_int, C.POINTER(C.c_void_p), C.POINTER(C.c_uint))
@GMFT
def get_module_function_table(module, out_table, out_size):
    if module not in tables:
        return 0
    out_table[0] = C.addressof(tables[module])
    out_size[0] = len(slots[module]) - 1
    return 1

class Callbacks(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("fn", GMFT)]
SETVER = C.CFUNCTYPE(None, C.c_uint32)
injected = []
@SETVER
def set_version(v):
    injected.append(v)
class VersionInfo(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("version", C.c_uint32), ("reserved0", C.c_uint32), ("fn", SETVER)]
cbs = Callbacks(C.sizeof(Callbacks), get_module_function_table)
ver = VersionInfo(C.sizeof(VersionInfo), 3, 0, set_version)

GET = C.CFUNCTYPE(C.c_void_p, C.c_uint32)
@GET
def get_export_table(i):
    return {1: C.addressof(cbs), 3: C.addressof(ver)}.get(i)

ok = lib.InitializeInjectionNvtx2(get_export_table)

class Payload(C.Union):
    _fields_ = [("u64", C.c_uint64), ("i64", C.c_int64), ("d", C.c_double),
                ("u32", C.c_uint32), ("i32", C.c_int32), ("f", C.c_float)]
class Message(C.Union):
    _fields_ = [("ascii", C.c_char_p), ("unicode", C.c_wchar_p), ("registered", C.c_void_p)]
class Attr(C.Structure):
    _fields_ = [("version", C.c_uint16), ("size", C.c_uint16), ("category", C.c_uint32),
                ("colorType", C.c_int32), ("color", C.c_uint32), ("payloadType", C.c_int32),
                ("reserved0", C.c_int32), ("payload", Payload), ("messageType", C.c_int32),
                ("message", Message)]

def fn(mod, cbid, restype, *argtypes):
    return C.CFUNCTYPE(restype, *argtypes)(slots[mod][cbid])

P = C.POINTER(Attr)
PushA = fn(1, 9, C.c_int, C.c_char_p)
PushW = fn(1, 10, C.c_int, C.c_wchar_p)
Pop = fn(1, 11, C.c_int)
MarkA = fn(1, 2, None, C.c_char_p)
StartA = fn(1, 5, C.c_uint64, C.c_char_p)
End = fn(1, 7, None, C.c_uint64)
NameCat = fn(1, 12, None, C.c_uint32, C.c_char_p)
NameThread = fn(1, 14, None, C.c_uint32, C.c_char_p)
DMark = fn(5, 1, None, C.c_void_p, P)
DPush = fn(5, 4, C.c_int, C.c_void_p, P)
DPop = fn(5, 5, C.c_int, C.c_void_p)
DNameCat = fn(5, 8, None, C.c_void_p, C.c_uint32, C.c_char_p)
DReg = fn(5, 10, C.c_void_p, C.c_void_p, C.c_char_p)
DCreate = fn(5, 12, C.c_void_p, C.c_char_p)
DCreateW = fn(5, 13, C.c_void_p, C.c_wchar_p)
DDestroy = fn(5, 14, None, C.c_void_p)

def attr(**kw):
    a = Attr(version=3, size=C.sizeof(Attr))
    for k, v in kw.items():
        if k in ("ascii", "unicode", "registered"):
            setattr(a.message, k, v)
            a.messageType = {"ascii": 1, "unicode": 2, "registered": 3}[k]
        elif k in ("u64", "i64", "d", "u32", "i32", "f"):
            setattr(a.payload, k, v)
            a.payloadType = {"u64": 1, "i64": 2, "d": 3, "u32": 4, "i32": 5, "f": 6}[k]
        else:
            setattr(a, k, v)
    return a

ret = {"ok": ok, "injected": injected, "attr_size": C.sizeof(Attr)}
ret["default"] = [PushA(b"a"), PushW("w\u00e9\u4e2d"), Pop(), Pop(), Pop()]
dom = DCreate(b"lib")
ret["same_handle"] = DCreate(b"lib") == dom and DCreateW("lib") == dom
DNameCat(dom, 4, b"cat four")
NameCat(4, b"default four")
h = DReg(dom, b"registered \"quoted\"\n")
ret["domain"] = [
    DPush(dom, attr(registered=h, category=4, u64=2**64 - 1, colorType=1, color=0xFF00FF00)),
    DPush(dom, attr(ascii=b"u32", u32=7)),
    DPush(dom, attr(unicode="i32", i32=-5)),
    DPush(dom, attr(f=0.5)),
    DPop(dom), DPop(dom), DPop(dom), DPop(dom), DPop(dom),
]
DMark(dom, attr(ascii=b"m", category=4))
MarkA(b"plain")
rid = StartA(b"s")
End(rid)
NameThread(1234, b"worker")
DDestroy(dom)
print(json.dumps(ret))
"""


def test_injection_protocol_driven_directly(nvtx_lib: Path, tmp_path: Path) -> None:
    out = tmp_path / "cap.jsonl"
    env = {**os.environ, **capture_env(out, nvtx_lib)}
    proc = subprocess.run(
        [sys.executable, "-c", _RUNTIME_HARNESS, str(nvtx_lib)], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    ret = json.loads(proc.stdout)
    assert ret["ok"] == 1 and ret["injected"] == [3]
    assert ret["attr_size"] == 48
    # push returns the level of the new range, pop the level of the range ended, -1 when none is open
    assert ret["default"] == [0, 1, 1, 0, -1]
    assert ret["same_handle"] is True
    assert ret["domain"] == [0, 1, 2, 3, 3, 2, 1, 0, -1]

    cap = parse_capture(out)
    assert [e.kind for e in cap.events] == [
        "init",
        "push", "push", "pop", "pop", "pop",
        "domain_create", "domain_create", "domain_create",
        "name_category", "name_category", "register_string",
        "push", "push", "push", "push", "pop", "pop", "pop", "pop", "pop",
        "mark", "mark", "range_start", "range_end", "name_thread", "domain_destroy",
    ]
    assert cap.events[0].depth is None and cap.events[0].domain is None
    pushes = cap.filter("push")
    assert [(e.domain, e.message, e.message_type) for e in pushes] == [
        ("", "a", "ascii"),
        ("", "w\u00e9\u4e2d", "unicode"),
        ("lib", 'registered "quoted"\n', "registered"),
        ("lib", "u32", "ascii"),
        ("lib", "i32", "unicode"),
        ("lib", None, None),
    ]
    assert [(e.payload, e.payload_type) for e in pushes[2:]] == [
        (2**64 - 1, "uint64"), (7, "uint32"), (-5, "int32"), (0.5, "float")
    ]
    assert (pushes[2].category, pushes[2].category_name, pushes[2].color) == (4, "cat four", 0xFF00FF00)
    marks = cap.filter("mark")
    assert [(m.domain, m.message, m.category_name) for m in marks] == [("lib", "m", "cat four"), ("", "plain", None)]
    (start,), (end,) = cap.filter("range_start"), cap.filter("range_end")
    assert start.range_id == end.range_id and start.message == "s"
    (named,) = cap.filter("name_thread")
    assert (named.target, named.message) == (1234, "worker")
    assert [e.domain for e in cap.filter("domain_destroy")] == ["lib"]
    assert not cap.is_balanced()
    problems = cap.problems()
    assert len(problems) == 2 and all(p.startswith("pop with no open range") for p in problems)
    assert "domain=''" in problems[0] and "domain='lib'" in problems[1]
    assert len({e.pid for e in cap.events}) == 1 and cap.events[0].pid > 0
    assert len({e.thread for e in cap.events}) == 1
    ts = [e.ts for e in cap.events]
    assert ts == sorted(ts)


def test_library_does_not_attach_without_a_capture_file(nvtx_lib: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != CAPTURE_FILE_ENV}
    code = textwrap.dedent(
        """
        import ctypes, sys
        lib = ctypes.CDLL(sys.argv[1])
        GET = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)
        print(lib.InitializeInjectionNvtx2(GET(lambda i: None)))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code, str(nvtx_lib)], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.strip() == "0"
    assert "GPUPROBE_NVTX_CAPTURE_FILE is not set" in proc.stderr


# --------------------------------------------------------------------------- parsing


def _write(path: Path, *lines: dict, tail: str = "") -> None:
    path.write_text("".join(json.dumps(obj) + "\n" for obj in lines) + tail)


def test_parse_drops_a_cut_last_line(tmp_path: Path) -> None:
    p = tmp_path / "c.jsonl"
    _write(p, {"kind": "push", "ts": 1, "pid": 1, "tid": 5, "domain": "d", "message": "a", "depth": 0},
           tail='{"kind":"pop","ts":2,"pi')
    cap = parse_capture(p)
    assert [e.kind for e in cap.events] == ["push"]
    assert cap.problems() == ["range never popped: 'a' domain='d' thread=5 ts=1"]
    assert cap.ranges()[0].closed is False
    assert "OPEN" in cap.format_ranges()


def test_parse_rejects_a_bad_line_in_the_middle(tmp_path: Path) -> None:
    p = tmp_path / "c.jsonl"
    p.write_text('{"kind":"push","ts":1,"tid":1}\nnot json\n{"kind":"pop","ts":2,"tid":1}\n')
    with pytest.raises(NvtxCaptureError, match=":2:"):
        parse_capture(p)


def test_parse_missing_file_is_empty(tmp_path: Path) -> None:
    cap = parse_capture(tmp_path / "absent.jsonl")
    assert cap.events == [] and not cap.attached and cap.is_balanced()


def test_ranges_are_per_thread_and_domain() -> None:
    ev = NvtxEvent
    cap = NvtxCapture([
        ev("push", "d", 1, "a", None, None, 1),
        ev("push", "d", 2, "b", None, None, 2),
        ev("push", "e", 1, "c", None, None, 3),
        ev("pop", "d", 1, None, None, None, 4),
        ev("pop", "e", 1, None, None, None, 5),
        ev("pop", "d", 2, None, None, None, 6),
    ])
    assert [(r.message, r.depth, r.parent, r.end_ts) for r in cap.ranges()] == [
        ("a", 0, None, 4), ("b", 0, None, 6), ("c", 0, None, 5)
    ]
    assert cap.names("d") == ["a", "b"]
    assert cap.threads("d") == [1, 2]
    assert cap.is_balanced()
