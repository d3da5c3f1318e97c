"""The diffusers integration's private parts; the public entry is :mod:`gpuprobe.integrations.diffusers`.

- :mod:`.compat`: the diffusers versions supported, and every reading of diffusers' own objects.
- :mod:`.seams`: the seams table (the pipeline's call, its components' methods) and their hooks.
- :mod:`.state`: what is prepared once per pipeline (its series, its components), and a call's steps.
- :mod:`.blocks`: the denoiser's blocks, found and timed on sampled steps.
- :mod:`.marks`: traced or audited steps (component ranges, the sync audit's attribution).

Importing this package imports neither torch nor diffusers.
"""
