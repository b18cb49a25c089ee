"""Getting an upstream vLLM wheel into the wheel cache, sha256-verified."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from vstack import settings
from vstack.errors import VstackError


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


class VerifiedCache:
    """Remembers sha256 of files by (size, mtime, inode), so a 336 MB wheel is hashed
    once per change rather than on every build."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.data = json.loads(path.read_text())
        except (OSError, ValueError):
            self.data = {}

    def known(self, file: Path) -> str | None:
        hit = self.data.get(str(file.resolve()))
        return hit["sha256"] if hit and hit["stamp"] == _stamp(file) else None

    def remember(self, file: Path, digest: str) -> None:
        self.data[str(file.resolve())] = {"stamp": _stamp(file), "sha256": digest}
        self._save()

    def record_known(self, file: Path) -> bool:
        """Whether file's RECORD was checked against its members (unchanged since)."""
        hit = self.data.get(f"record:{file.resolve()}")
        return bool(hit and hit["stamp"] == _stamp(file))

    def remember_record(self, file: Path) -> None:
        self.data[f"record:{file.resolve()}"] = {"stamp": _stamp(file)}
        self._save()

    def _save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError:
            pass  # only an optimisation


def check_record(wheel: Path, cache: VerifiedCache | None = None) -> None:
    """A wheel's RECORD matches its members (vstack.wheelzip.verify_record), checked
    when it is pinned and before a build copies its lines; once per file state."""
    from vstack.wheelzip import verify_record

    if cache and cache.record_known(wheel):
        return
    verify_record(wheel)
    if cache:
        cache.remember_record(wheel)


def verify(file: Path, expected: str, cache: VerifiedCache | None = None) -> None:
    if cache and cache.known(file) == expected:
        return
    got = sha256_file(file)
    if got != expected:
        raise VstackError(
            f"sha256 mismatch for {file}: stack.toml pins {expected}, file has {got}"
        )
    if cache:
        cache.remember(file, got)


# Seconds pip waits on a silent connection before it retries (twice) and gives up.
DOWNLOAD_TIMEOUT_S = 60


def download_timeout() -> float:
    return settings.env_seconds("VSTACK_DOWNLOAD_TIMEOUT", DOWNLOAD_TIMEOUT_S)


def _network_reason(lines: list[str], timeout: float) -> str | None:
    text = "\n".join(lines)
    if re.search(r"timed out|TimeoutError", text):
        return f"the package index did not answer within {timeout:g} s (3 tries; VSTACK_DOWNLOAD_TIMEOUT)"
    if re.search(r"Connection refused|NewConnectionError|Name or service not known|"
                 r"Temporary failure in name resolution", text):  # fmt: skip
        return "the package index could not be reached (connection refused or no such host)"
    return None


def _pip_download(spec: str, dest: Path) -> None:
    timeout = download_timeout()
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--timeout", f"{timeout:g}", "--retries", "2",
        "--progress-bar", "on", "-d", str(dest), spec,
    ]  # fmt: skip
    print(
        f"vstack: downloading {spec} with pip (gives up after {timeout:g} s of silence "
        f"from the index, retried twice) ...",
        file=sys.stderr,
    )
    # pip's own report and progress bar go to this process's stderr as they come
    # (stdout stays for vstack's output); its stderr is echoed and kept for the error.
    proc = subprocess.Popen(
        cmd, stdout=2, stderr=subprocess.PIPE, text=True, errors="replace"
    )
    said = []
    for line in proc.stderr:
        said.append(line.rstrip("\n"))
        print(f"  pip: {said[-1]}", file=sys.stderr)
    rc = proc.wait()
    if rc != 0:
        lines = [ln for ln in said if ln.strip()]
        reason = _network_reason(lines, timeout) or (
            lines[-1] if lines else f"exit {rc}"
        )
        raise VstackError(f"pip could not download {spec}: {reason}")


def fetch_wheel(
    version: str,
    cache_dir: Path,
    wheel_name: str | None = None,
    sha256: str | None = None,
    verified: VerifiedCache | None = None,
) -> Path:
    """Return the cached wheel of vLLM `version`, downloading it if absent.

    With wheel_name/sha256 given (a pin), the file must have exactly that name and
    hash; a fresh download that does not match is discarded, a cached file is left
    where it is for the user to inspect.
    """
    from vstack.locks import held_folder, sweep_folders

    sweep_folders(cache_dir, ".download-*")
    if wheel_name:
        cached = cache_dir / wheel_name
        if cached.is_file():
            if sha256:
                verify(cached, sha256, verified)
            return cached
    else:
        hits = sorted(cache_dir.glob(f"vllm-{version}-*.whl"))
        if hits:
            if sha256:
                verify(hits[0], sha256, verified)
            return hits[0]
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(dir=cache_dir, prefix=".download-") as tmp,
        held_folder(Path(tmp)),
    ):
        try:
            _pip_download(f"vllm=={version}", Path(tmp))
        except VstackError as e:
            where = cache_dir / (wheel_name or f"vllm-{version}-*.whl")
            raise VstackError(f"{e} (and no cached wheel at {where})") from None
        got = sorted(Path(tmp).glob("vllm-*.whl"))
        if not got:
            raise VstackError(f"pip download of vllm=={version} produced no wheel")
        wheel = got[0]
        if wheel_name and wheel.name != wheel_name:
            raise VstackError(
                f"pip downloaded {wheel.name}, but stack.toml pins {wheel_name}"
            )
        if sha256:
            verify(wheel, sha256)
        final = cache_dir / wheel.name
        shutil.move(str(wheel), final)
    return final


def cache_local_wheel(wheel: Path, cache_dir: Path) -> Path:
    """The wheel cache's copy of a wheel given as a file (rebase --onto x.whl): the
    next build looks for the pinned wheel there, and could not download a nightly."""
    target = cache_dir / wheel.name
    if target.resolve() == wheel.resolve():
        return target
    if target.is_file():
        if sha256_file(target) == sha256_file(wheel):
            return target
        raise VstackError(
            f"the wheel cache already has a different {wheel.name} ({target}): "
            f"remove one of the two"
        )
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f".{wheel.name}.{os.getpid()}.tmp"
    try:
        shutil.copyfile(wheel, tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    print(
        f"vstack: copied {wheel.name} into the wheel cache {cache_dir}", file=sys.stderr
    )
    return target
