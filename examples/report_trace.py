"""Record a profile window over a tiny model's generate() and report on it.

Run: python examples/report_trace.py   (writes /tmp/gpuprobe-example.json.gz)
"""

import torch
import transformers

import gpuprobe
from gpuprobe.integrations.transformers import instrument
from gpuprobe.report import analyze, render


def main(path: str = "/tmp/gpuprobe-example.json.gz") -> None:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    model = transformers.LlamaForCausalLM(cfg).eval()
    instrument(model)
    window = gpuprobe.profile("2-6", output=path)  # decode steps 2 to 6
    ids = torch.randint(0, 128, (1, 8))
    model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    print("trace:", window.path)
    print(render(analyze(path, sections=["summary", "steps", "cpu_ops"], top=8), "text"))


if __name__ == "__main__":
    main()
