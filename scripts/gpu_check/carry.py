"""What travels to the GPU machine, how big it is, and fetching the wheels that travel with it.

The machine gets a copy of the working tree (tracked files and untracked files git does not
ignore) plus the ignored paths a run names in `carry` (here `.whl/`), 64 MiB in all, and cannot
download anything. `requirements/gpu-check.txt` pins the wheels it needs; `fetch` puts exactly
those into `.whl/` (binary wheels for CPython 3.12 on manylinux x86_64 via `pip download`; a pin
marked `sdist` is built here into a pure-Python wheel with uv); `dry_run` lists what would travel,
checks the total against the limit and says which pinned wheels are missing or doubled (two
versions of one project stop the whole install there).

Pure: `parse_pins`, `lock_versions`, `wheel_problems`, `size_report`. I/O: `carried_files`,
`fetch`, `dry_run`. Neighbours: `__main__.py` (the `--dry-run` and `--fetch` verbs),
`scripts/gpu-check.sh` (installs `.whl/*.whl` on the GPU machine).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence

LIMIT_BYTES = 64 * 2**20
PINS_FILE = "requirements/gpu-check.txt"
LOCK_FILE = "requirements/lock.txt"
WHEEL_DIR = ".whl"
CARRY = (WHEEL_DIR,)
# The GPU machine's interpreter and platform (a wheel must match one of these to install there).
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


@dataclasses.dataclass(frozen=True)
class Pin:
    name: str
    version: str
    sdist: bool = False

    @property
    def key(self) -> str:
        return normalize(self.name)


def normalize(name: str) -> str:
    """A project name as wheel file names and the lock spell it alike (PEP 503, with underscores)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def parse_pins(text: str) -> list[Pin]:
    """`name==version  # comment` lines; a comment starting with `sdist` marks a build from source."""
    pins = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line, _, comment = raw.partition("#")
        if not line.strip():
            continue
        m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)\s*", line)
        if m is None:
            raise ValueError(f"{PINS_FILE}:{lineno}: expected name==version, got {raw!r}")
        pins.append(Pin(m[1], m[2], comment.strip().startswith("sdist")))
    return pins


def lock_versions(text: str) -> dict[str, str]:
    """The `name==version` pins of requirements/lock.txt, by normalized name."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        if m:
            out[normalize(m[1])] = m[2]
    return out


def wheel_project(filename: str) -> tuple[str, str]:
    """(normalized project, version) of a wheel file name."""
    name, version = filename.split("-")[:2]
    return normalize(name), version


def wheel_problems(pins: Sequence[Pin], wheel_names: Iterable[str]) -> list[str]:
    """What keeps `.whl/` from installing the pins there: missing, wrong or doubled wheels."""
    have: dict[str, list[str]] = {}
    for w in wheel_names:
        if w.endswith(".whl"):
            project, version = wheel_project(w)
            have.setdefault(project, []).append(version)
    problems = []
    for p in pins:
        versions = have.get(p.key, [])
        if not versions:
            problems.append(f"{p.name}=={p.version}: no wheel")
        elif versions != [p.version]:
            problems.append(f"{p.name}=={p.version}: found {', '.join(sorted(versions))}")
    pinned = {p.key for p in pins}
    problems += [f"{name}: not pinned in {PINS_FILE}" for name in sorted(set(have) - pinned)]
    return problems


@dataclasses.dataclass(frozen=True)
class SizeReport:
    total: int
    limit: int
    by_top: dict[str, int]
    largest: list[tuple[str, int]]

    @property
    def fits(self) -> bool:
        return self.total < self.limit


def size_report(files: Sequence[tuple[str, int]], limit: int = LIMIT_BYTES) -> SizeReport:
    """Totals of (path, bytes) pairs, by top-level folder, with the ten largest files."""
    by_top: dict[str, int] = {}
    for path, size in files:
        top = path.split("/", 1)[0] if "/" in path else "."
        by_top[top] = by_top.get(top, 0) + size
    largest = sorted(files, key=lambda f: -f[1])[:10]
    return SizeReport(sum(s for _, s in files), limit, dict(sorted(by_top.items())), list(largest))


def carried_files(repo: pathlib.Path, carry: Sequence[str] = CARRY) -> list[tuple[str, int]]:
    """(path, bytes) of everything that would travel: tracked + untracked-not-ignored + `carry`."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout.decode()
    paths = dict.fromkeys(p for p in out.split("\0") if p)
    for c in carry:
        root = repo / c
        if root.is_file():
            paths[c] = None
        for dirpath, _, names in os.walk(root):
            for n in names:
                paths[str(pathlib.Path(dirpath, n).relative_to(repo))] = None
    files = []
    for p in paths:
        full = repo / p
        if full.is_symlink() or full.is_file():  # a tracked file deleted in the worktree does not travel
            files.append((p, full.lstat().st_size))
    return files


def format_report(report: SizeReport, problems: Sequence[str]) -> str:
    mib = 2**20
    lines = [f"what travels to the GPU machine (tracked + untracked-not-ignored + {', '.join(CARRY)}):"]
    lines += [
        f"  {top + '/' if top != '.' else '(root files)':<28} {size / mib:8.2f} MiB"
        for top, size in report.by_top.items()
    ]
    lines += ["largest files:"] + [f"  {size / mib:8.2f} MiB  {path}" for path, size in report.largest]
    verdict = "fits" if report.fits else "TOO BIG"
    lines.append(f"total {report.total / mib:.2f} MiB of {report.limit / mib:.0f} MiB: {verdict}")
    if problems:
        lines.append(f"wheels in {WHEEL_DIR}/ not ready (run scripts/gpu-check.sh --fetch):")
        lines += [f"  {p}" for p in problems]
    else:
        lines.append(f"wheels in {WHEEL_DIR}/: every pin of {PINS_FILE}, one version each")
    return "\n".join(lines)


def dry_run(repo: pathlib.Path) -> int:
    """Print what would travel; exit code 1 if it is over the limit (missing wheels only warn)."""
    report = size_report(carried_files(repo))
    pins = parse_pins((repo / PINS_FILE).read_text())
    wheels = [p.name for p in (repo / WHEEL_DIR).glob("*.whl")] if (repo / WHEEL_DIR).is_dir() else []
    print(format_report(report, wheel_problems(pins, wheels)))
    return 0 if report.fits else 1


# ------------------------------------------------------------------ fetch


def _pip_python(repo: pathlib.Path) -> str:
    """A Python that has pip (uv's venvs have none): $PIP_PYTHON, else a python3 outside .venv."""
    if os.environ.get("PIP_PYTHON"):
        return os.environ["PIP_PYTHON"]
    candidates = [sys.executable] + [
        str(pathlib.Path(d, "python3")) for d in os.environ.get("PATH", "").split(os.pathsep) if d
    ]
    for c in candidates:
        if (
            pathlib.Path(c).is_file()
            and subprocess.run([c, "-m", "pip", "--version"], capture_output=True).returncode == 0
        ):
            return c
    raise SystemExit("gpu-check --fetch: no python3 with pip found; set PIP_PYTHON")


def _uv() -> str:
    found = shutil.which("uv")
    if found:
        return found
    # machine_cache.home(), spelled out: this script also runs under pythons lacking plrl_workers
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "plrl"
    for uv in sorted(cache.glob("uv-*/bin/uv")):
        return str(uv)
    raise SystemExit("gpu-check --fetch: uv not found (make venv installs it under ~/.cache/plrl)")


def fetch(repo: pathlib.Path) -> int:
    """Download (or build) every pinned wheel into .whl/, dropping other versions of those projects."""
    pins = parse_pins((repo / PINS_FILE).read_text())
    dest = repo / WHEEL_DIR
    dest.mkdir(exist_ok=True)
    pip = _pip_python(repo)
    for pin in pins:
        for old in dest.glob("*.whl"):
            project, version = wheel_project(old.name)
            if project == pin.key and version != pin.version:
                old.unlink()
        if any(wheel_project(w.name) == (pin.key, pin.version) for w in dest.glob("*.whl")):
            continue
        spec = f"{pin.name}=={pin.version}"
        print(f"gpu-check --fetch: {spec}{' (building from the sdist)' if pin.sdist else ''}", flush=True)
        if not pin.sdist:
            platforms = [a for p in PLATFORMS for a in ("--platform", p)]
            subprocess.run(
                [
                    *(pip, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"),
                    *("--python-version", PYTHON_VERSION, "--implementation", "cp", *platforms),
                    *("-d", str(dest), spec),
                ],
                check=True,
            )
            continue
        build_python = repo / ".venv" / "bin" / "python"  # the sdist's setup.py imports torch
        if not build_python.exists():
            raise SystemExit(f"gpu-check --fetch: building {spec} needs the project's venv: make venv")
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                [pip, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", tmp, spec],
                check=True,
            )
            (sdist,) = pathlib.Path(tmp).glob("*.tar.gz")
            env = dict(os.environ, DS_BUILD_OPS="0", VIRTUAL_ENV=str(repo / ".venv"))
            subprocess.run(
                [
                    _uv(),
                    "build",
                    "-q",
                    "--wheel",
                    "--no-build-isolation",
                    "--python",
                    str(build_python),
                    "-o",
                    tmp,
                    str(sdist),
                ],
                check=True,
                env=env,
            )
            for built in pathlib.Path(tmp).glob("*.whl"):
                shutil.move(str(built), dest / built.name)
    problems = wheel_problems(pins, [w.name for w in dest.glob("*.whl")])
    for p in problems:
        print(f"gpu-check --fetch: {p}", file=sys.stderr)
    return 1 if problems else 0
