"""A continuous-batching workload for the monitoring tests, and nothing else: a tiny Llama built from a config
(no download), instrumented, serving ``generate_batch`` rounds until stopped, with gpuprobe's /metrics on
``--port``. It makes no ``generate()`` call, as ``transformers serve --continuous-batching`` makes none.
Service-level goals come from the environment (``GPUPROBE_SLO_*``) when the test sets them.

Stops on SIGTERM/SIGINT or after ``--seconds``. Prints one line ``serving <url>`` once /metrics is up.
"""

from __future__ import annotations

import argparse
import signal
import threading

import torch
import transformers

import gpuprobe
from gpuprobe.integrations import transformers as hf

MODEL_NAME = "tiny-cb"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=900)
    args = parser.parse_args()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    timer = threading.Timer(args.seconds, stop.set)
    timer.daemon = True
    timer.start()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=256,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = hf.instrument(transformers.LlamaForCausalLM(config).eval(), model_name=MODEL_NAME)
    server = gpuprobe.serve(port=args.port)
    print(f"serving {server.url}", flush=True)
    gen = transformers.GenerationConfig(max_new_tokens=12, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cache = transformers.ContinuousBatchingConfig(num_blocks=64, page_size=16, max_batch_tokens=48)
    round_ = 0
    while not stop.is_set():
        prompts = [[3 + (round_ + i * 7 + j) % 120 for j in range(4 + (round_ + i) % 9)] for i in range(6)]
        model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cache)
        round_ += 1
        stop.wait(0.05)
    server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
