"""The prepared GPU check: the CUDA paths and this GPU's utilisation curve in one short run.

`scripts/gpu-check.sh` is the entry point (it installs the carried wheels on the GPU machine and
sets PYTHONPATH); this package is the driver it starts: `__main__` (the CLI), `stages` (what runs,
with per-stage time caps), `runner` (runs them under one deadline, writes the output folder),
`collect` (judges each stage's output, pure), `results` (the `results.json` schema and
`summary.txt`), `carry` (what travels to the machine, its size, fetching the wheels), `probe` (the
env stage, run in the interpreter under test) and `absent/` (makes the packages the GPU image
lacks absent in `--cpu` mode too, so the CPU run proves the GPU-check path does not need them).
The driver itself needs only the standard library (and PyYAML to write the demo job).
"""
