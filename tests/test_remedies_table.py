"""The table from a finding to the ``gpuprobe try`` variants that measure its remedy is a leaf the live
sync audit reads without importing ``gpuprobe try``: ``gpuprobe._remedies``, its names the same objects
under ``gpuprobe.experiment`` and ``gpuprobe.experiment.remedies``."""

from __future__ import annotations

from helpers import run_python


def test_the_sync_audit_reads_the_table_without_loading_gpuprobe_try() -> None:
    code = ("import sys, gpuprobe._sync_audit, gpuprobe._remedies as r; "
            "print(r.variant_for_sync_site('logits_processor', 'BanRepeats'), "
            "sorted(m for m in sys.modules if m.startswith('gpuprobe.experiment')))")
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "no-logits-processor:BanRepeats []"


def test_the_table_imports_nothing_of_gpuprobe() -> None:
    import ast
    from pathlib import Path

    import gpuprobe._remedies as remedies

    tree = ast.parse(Path(remedies.__file__).read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(name.startswith("gpuprobe") for name in imported), imported


def test_the_old_paths_give_the_same_objects() -> None:
    import gpuprobe._remedies as leaf
    import gpuprobe.experiment as try_package
    import gpuprobe.experiment.remedies as old

    for name in leaf.__all__:
        assert getattr(old, name) is getattr(leaf, name), name
    for name in ("REMEDY_VARIANTS", "RemedyVariants", "remedy_line", "try_command", "variant_for_sync_site"):
        assert getattr(try_package, name) is getattr(leaf, name), name
    assert old.__all__ == leaf.__all__
