"""The project's helper scripts; a package so `python -m scripts.gpu_check` runs from the repo root."""
