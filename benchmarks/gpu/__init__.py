"""The GPU check (``scripts/gpu-check``): one command that tests and benchmarks gpuprobe on a GPU machine.

``check`` runs the parts and writes the results; ``runner`` runs the benchmarks in a child process; each
other module measures one thing, reusing the CPU benchmarks of ``benchmarks/``.
"""
