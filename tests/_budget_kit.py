"""What the plugin's tests share: the conftest of the test folders they write (a tiny Llama built from a
config), and running pytest there in a process of its own (pytester)."""

from __future__ import annotations

import re
import textwrap

import pytest

CONFTEST = '''
import pytest
import torch
import transformers

LAYERS = 2


@pytest.fixture(scope="session")
def model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture
def ids():
    return torch.tensor([[5, 6, 7, 8, 9, 10]])
'''

TIMEOUT = 300


def run(pytester: pytest.Pytester, files: dict[str, str], *args: str) -> pytest.RunResult:
    pytester.makeconftest(CONFTEST)
    for name, text in files.items():
        pytester.path.joinpath(name).write_text(textwrap.dedent(text), encoding="utf-8")
    return pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-rfEs", *args,
                                         timeout=TIMEOUT)


def section(out: str, test: str) -> str:
    """The failure report of ``test`` in pytest's output: from its ``___ test ___`` header to the next one."""
    m = re.search(rf"^_+ {re.escape(test)} _+$(.*?)(?=^_+ \w+ _+$|^=+ short test summary)", out, re.M | re.S)
    assert m is not None, (test, out)
    return m.group(1).strip()


def line_of(text: str, needle: str) -> int:
    """The 1-based line of ``needle`` in ``text`` as written to the file (dedented)."""
    lines = textwrap.dedent(text).splitlines()
    return next(i for i, line in enumerate(lines, start=1) if needle in line)
