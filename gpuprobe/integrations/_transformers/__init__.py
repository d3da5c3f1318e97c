"""The transformers integration's private parts; the public entry is :mod:`gpuprobe.integrations.transformers`.

- :mod:`.compat`: the transformers versions supported, and every reading of transformers' own objects.
- :mod:`.series`: the series ``generate()`` and continuous batching both record, and their shared formulas.
- :mod:`.generate`: ``generate()`` seen step by step; its seams table is :mod:`.generate.seams`.
- :mod:`.continuous`: continuous batching (requests, scheduler steps, the paged KV cache); its seams
  table is :mod:`.continuous.seams`.

Importing this package imports neither torch nor transformers.
"""
