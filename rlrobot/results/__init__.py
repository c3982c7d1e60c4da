"""Reproducible results: the benchmark registry (``registry.ENTRIES``), the runner that reproduces an entry over
seeds into ``results/<name>.json`` (``runner``), and the README table and learning-curve PNGs generated from those
files (``report``). CLI: ``rlrobot results run | table | list``."""
