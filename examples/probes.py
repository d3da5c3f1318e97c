"""Probes on plain functions, blocks, async code and generators, with a live /metrics endpoint.

Run: python examples/probes.py
"""

import asyncio
import urllib.request

import gpuprobe
from gpuprobe import probe


@probe  # named after the function: "tokenize"
def tokenize(text: str) -> list[int]:
    return [ord(c) % 128 for c in text]


@probe("postprocess", kind="user", attrs={"stage": "post"}, memory=True)
def postprocess(ids: list[int]) -> str:
    return "".join(chr(32 + i % 90) for i in ids)


@probe("fetch")
async def fetch(i: int) -> int:
    await asyncio.sleep(0.001)
    return i


@probe("stream")
def stream(n: int):  # the range spans the first next() to the end
    yield from range(n)


def main() -> None:
    server = gpuprobe.serve(port=0)
    for step in range(20):
        with probe("step", kind="step"):
            postprocess(tokenize("hello gpuprobe"))
        gpuprobe.step()
    async def fetch_all() -> list[int]:
        return await asyncio.gather(*(fetch(i) for i in range(5)))

    assert asyncio.run(fetch_all()) == [0, 1, 2, 3, 4]
    assert sum(stream(10)) == 45
    text = urllib.request.urlopen(server.url).read().decode()
    lines = [line for line in text.splitlines() if line.startswith("gpuprobe_probe_duration_seconds_count")]
    print("\n".join(lines))
    print(gpuprobe.info())
    server.close()


if __name__ == "__main__":
    main()
