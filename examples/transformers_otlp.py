"""Push generation metrics to an OpenTelemetry collector over OTLP/HTTP.

With --url, metrics go to your collector (e.g. http://127.0.0.1:4318/v1/metrics). Without it, the
example starts a stand-in receiver on a free local port and prints the metric names it received.

    python examples/transformers_otlp.py [--url http://127.0.0.1:4318/v1/metrics]
"""

from __future__ import annotations

import argparse
import http.server
import threading

import torch
from transformers import MistralConfig, MistralForCausalLM

import gpuprobe
from gpuprobe.integrations.transformers import instrument

parser = argparse.ArgumentParser()
parser.add_argument("--url", help="OTLP/HTTP metrics endpoint of a collector")
args = parser.parse_args()

received: list[str] = []


class Receiver(http.server.BaseHTTPRequestHandler):
    """Accepts OTLP/HTTP protobuf exports and keeps the metric names."""

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportMetricsServiceRequest.FromString(body)
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                received.extend(m.name for m in sm.metrics)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


url = args.url
httpd = None
if url is None:
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1/metrics"

gpuprobe.configure(otlp_endpoint=url, otlp_interval=1.0)
model = MistralForCausalLM(MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                         pad_token_id=0, eos_token_id=None)).eval()
instrument(model, model_name="tiny-mistral")
model.generate(torch.randint(3, 128, (2, 8)), max_new_tokens=16, do_sample=True)
gpuprobe.configure(otlp_endpoint=None)  # stops the exporter after a last push
print("pushed to", url)
if httpd is not None:
    print("the receiver got:", ", ".join(sorted(set(received))))
    httpd.shutdown()
