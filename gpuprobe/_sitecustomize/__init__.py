"""The directory ``gpuprobe run`` puts first on ``PYTHONPATH``: its ``sitecustomize`` module switches
gpuprobe on in the command's Python processes (see :mod:`gpuprobe._bootstrap`)."""
