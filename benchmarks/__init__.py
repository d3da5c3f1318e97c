"""Benchmarks: each module runs on its own (``python benchmarks/NAME.py``); ``benchmarks.gpu`` is the GPU check."""
