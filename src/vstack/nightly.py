"""vLLM's per-commit wheel repository ("nightly"): a wheel for every commit on main.

The repository is a tree of PEP 503 simple indexes: `<base>/<commit>/vllm/` lists the
wheels built from one commit (full 40-hex id), `<base>/nightly/vllm/` those of the
newest commit on main, and `<base>/<commit>/<variant>/vllm/` a non-default build
(e.g. cu129). The links are relative (`../../<commit>/vllm-...whl`), so the commit
a nightly was built from is read off the wheel's URL.
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import os
import re
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

from vstack import pep440
from vstack.config import Pin, Project
from vstack.errors import VstackError

DEFAULT_INDEX = "https://wheels.vllm.ai"
NIGHTLY = "nightly"
FULL_SHA = re.compile(r"[0-9a-f]{40}")
SHORT_SHA = re.compile(r"[0-9a-f]{7,40}")
WHEEL_NAME = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?"
    r"-(?P<python>[^-]+)-(?P<abi>[^-]+)-(?P<platform>[^-]+)\.whl$"
)


# ---------------------------------------------------------------- pure helpers


def is_per_commit_target(onto: str) -> bool:
    """`nightly`, or a commit id (7 to 40 hex digits) of vLLM's main branch."""
    return onto == NIGHTLY or SHORT_SHA.fullmatch(onto) is not None


def is_per_commit_pin(pin: Pin) -> bool:
    """A pin taken from the per-commit repository records the full commit id."""
    return FULL_SHA.fullmatch(pin.short_hash) is not None


def index_url(project: Project, flag: str | None = None) -> str:
    """--wheel-index, else VSTACK_WHEEL_INDEX, else stack.toml, else vLLM's."""
    url = (
        flag
        or os.environ.get("VSTACK_WHEEL_INDEX")
        or project.wheel_index
        or DEFAULT_INDEX
    )
    return url.rstrip("/")


def package_url(base: str, ref: str, variant: str = "") -> str:
    return f"{base}/{ref}/{variant.strip('/') + '/' if variant else ''}vllm/"


@dataclasses.dataclass(frozen=True)
class Link:
    name: str  # the wheel file name
    url: str  # absolute, without the fragment
    sha256: str | None  # from a "#sha256=" fragment, when the index gives one


class _Anchors(HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.hrefs.append(href)


def parse_simple_index(html: str, page_url: str) -> list[Link]:
    """The wheel links of a PEP 503 project page, resolved against its URL."""
    parser = _Anchors()
    parser.feed(html)
    links = []
    for href in parser.hrefs:
        url, _, frag = urllib.parse.urljoin(page_url, href).partition("#")
        name = urllib.parse.unquote(url.rsplit("/", 1)[-1])
        if not name.endswith(".whl"):
            continue
        m = re.fullmatch(r"sha256=([0-9a-f]{64})", frag)
        links.append(Link(name, url, m.group(1) if m else None))
    return links


def commit_of(url: str) -> str | None:
    """The 40-hex folder a wheel lives in (`<base>/<commit>/<wheel>`)."""
    parts = urllib.parse.urlsplit(url).path.split("/")
    return parts[-2] if len(parts) >= 2 and FULL_SHA.fullmatch(parts[-2]) else None


def choose_wheel(links: list[Link], arch: str, where: str) -> Link:
    """The vllm wheel for `arch` (x86_64, aarch64); the newest if there are several."""
    fits = []
    for link in links:
        m = WHEEL_NAME.match(link.name)
        if not m or m["name"].lower() != "vllm":
            continue
        plats = m["platform"].split(".")
        if any(p == "any" or p.endswith("_" + arch) for p in plats):
            fits.append((version_key(m["version"]) or (), link.name, link))
    if not fits:
        names = ", ".join(sorted(link.name for link in links)) or "no wheels"
        raise VstackError(f"no vllm wheel for {arch} at {where} (it lists: {names})")
    return max(fits, key=lambda t: (t[0], t[1]))[2]


def version_key(version: str) -> tuple | None:
    """A sort key for PEP 440 versions, as packaging orders them (vstack.pep440), or
    None when `version` is not one: 0.34.0 < 0.34.1.dev12+g1a2b3c4 < 0.34.1rc1 < 0.34.1."""
    v = pep440.parse(version)
    return v.key() if v is not None else None


def nearest_record(root: Path, name: str, target: str, after: str) -> Path | None:
    """The resolution record of patch `name` for the newest recorded version in
    (after, target]: a nightly between releases replays the port made for the
    release it follows, and when that no longer applies the record is stale."""
    t, a = version_key(target), version_key(after)
    folder = root / "resolutions"
    if t is None or not folder.is_dir():
        return None
    hits = []
    for d in folder.iterdir():
        k = version_key(d.name)
        if k is not None and (a is None or k > a) and k <= t and (d / name).is_file():
            hits.append((k, d / name))
    return max(hits)[1] if hits else None


# ---------------------------------------------------------------- network


def _timeout() -> float:
    from vstack.fetch import download_timeout

    return download_timeout()


def _open(url: str):
    timeout = _timeout()
    req = urllib.request.Request(url, headers={"User-Agent": "vstack"})
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        raise VstackError(f"{url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, TimeoutError):
            raise VstackError(f"no answer from {url} in {timeout:g} s") from None
        raise VstackError(f"cannot reach {url}: {e.reason}") from None
    except TimeoutError:
        raise VstackError(f"no answer from {url} in {timeout:g} s") from None
    except (http.client.HTTPException, OSError) as e:
        # e.g. RemoteDisconnected: the server closed the connection unanswered
        raise VstackError(f"{url}: the server gave no answer ({_why(e)})") from None


def _why(e: BaseException) -> str:
    return str(e) or type(e).__name__


def fetch_text(url: str) -> str:
    with _open(url) as r:
        try:
            return r.read().decode("utf-8", errors="replace")
        except TimeoutError:
            raise VstackError(f"{url} stalled for {_timeout():g} s") from None
        except (http.client.HTTPException, OSError) as e:
            raise VstackError(f"{url}: the answer was cut off ({_why(e)})") from None


def download(url: str, dest: Path, expected: str | None = None) -> str:
    """Stream url into dest (atomically, via a .download- file beside it) with
    progress on stderr; return its sha256, which must equal `expected` if given."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".download-", dir=dest.parent)
    tmp = Path(tmp_name)
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, _open(url) as r:
            total = int(r.headers.get("Content-Length") or 0)
            size = f"{total / 1e6:.0f} MB" if total else "size unknown"
            print(f"vstack: downloading {url} ({size}) ...", file=sys.stderr)
            done, shown, t0 = 0, 0, time.monotonic()
            while True:
                try:
                    chunk = r.read(1 << 20)
                except TimeoutError:
                    raise VstackError(
                        f"{url} stalled for {_timeout():g} s after {done / 1e6:.0f} MB"
                    ) from None
                except (http.client.HTTPException, OSError) as e:
                    raise VstackError(
                        f"{url}: the download was cut off after {done / 1e6:.0f} MB "
                        f"({_why(e)}); nothing was cached"
                    ) from None
                if not chunk:
                    break
                out.write(chunk)
                h.update(chunk)
                done += len(chunk)
                step = done * 10 // total if total else done // 50_000_000
                if step > shown:
                    shown = step
                    rate = done / 1e6 / max(time.monotonic() - t0, 1e-3)
                    pct = f"{done * 100 // total}% of {size}, " if total else ""
                    print(
                        f"vstack:   {done / 1e6:.0f} MB ({pct}{rate:.0f} MB/s)",
                        file=sys.stderr,
                    )
            if total and done != total:
                raise VstackError(
                    f"{url}: got {done} of {total} bytes (cut off); nothing was cached"
                )
        digest = h.hexdigest()
        if expected and digest != expected:
            raise VstackError(
                f"sha256 mismatch for {url}: expected {expected}, got {digest}"
            )
        if not expected:
            # Nothing to check the bytes against (no #sha256= in the index, no
            # Content-Length): at least they must be a whole wheel, or a cut download
            # would be cached as the wheel and fail every later run.
            problem = incomplete_wheel(tmp)
            if problem:
                raise VstackError(
                    f"{url}: the download is not a whole wheel ({problem}; cut off?); "
                    f"nothing was cached"
                )
        os.replace(tmp, dest)
        return digest
    finally:
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------- resolving


@dataclasses.dataclass(frozen=True)
class PerCommitWheel:
    wheel: Path  # in the wheel cache
    sha256: str
    commit: str  # full 40-hex upstream commit
    url: str


def _arch() -> str:
    return os.environ.get("VSTACK_WHEEL_ARCH") or "x86_64"


def _links(url: str) -> list[Link]:
    return parse_simple_index(fetch_text(url), url)


def _full_commit(project: Project, base: str, short: str) -> str:
    """A short commit id made full: from the nightly (when it is that commit), else
    from the vllm/ checkout. The repository is keyed by full ids only."""
    for link in _links(package_url(base, NIGHTLY, project.wheel_variant)):
        c = commit_of(link.url)
        if c and c.startswith(short):
            return c
    sub = project.submodule
    if (sub / ".git").exists():
        from vstack import gitutil

        p = gitutil.git(
            sub, "rev-parse", "--verify", "--quiet", f"{short}^{{commit}}", check=False
        )
        if p.returncode == 0:
            return p.stdout.strip()
    raise VstackError(
        f"{short} is not the newest nightly and vllm/ does not know it; the per-commit "
        f"repository is keyed by full commit ids: give all 40 hex digits "
        f"(git ls-remote / git rev-parse on a vLLM clone)"
    )


def incomplete_wheel(path: Path) -> str | None:
    """Why the file at path is not a whole zip archive (None when it is one)."""
    from vstack.wheelzip import read_members

    try:
        members, _ = read_members(path)
    except VstackError as e:
        return str(e).removeprefix(f"{path}: ")
    if not members:
        return "an empty archive"
    return None


def _cached_or_download(project: Project, link: Link) -> tuple[Path, str]:
    from vstack.fetch import sha256_file

    dest = project.wheel_cache / link.name
    if dest.is_file():
        digest = sha256_file(dest)
        if link.sha256 and digest != link.sha256:
            raise VstackError(
                f"sha256 mismatch for the cached {dest}: the index says {link.sha256}, "
                f"the file has {digest}"
            )
        problem = None if link.sha256 else incomplete_wheel(dest)
        if problem:
            raise VstackError(
                f"the cached {dest} is not a whole wheel ({problem}): a download cut "
                f"off by an older vstack? Remove it and rerun (it is downloaded again)"
            )
        print(f"vstack: using the cached {dest}", file=sys.stderr)
        return dest, digest
    return dest, download(link.url, dest, link.sha256)


def fetch_per_commit(
    project: Project, onto: str, flag: str | None = None
) -> PerCommitWheel:
    """The wheel of `nightly` or of a commit, in the wheel cache."""
    base = index_url(project, flag)
    variant = project.wheel_variant
    if onto == NIGHTLY:
        page = package_url(base, NIGHTLY, variant)
        link = choose_wheel(_links(page), _arch(), page)
        commit = commit_of(link.url)
        if commit is None:
            raise VstackError(
                f"{page} links {link.url}, which names no commit folder; "
                f"cannot tell which commit the nightly is"
            )
    else:
        commit = onto if FULL_SHA.fullmatch(onto) else _full_commit(project, base, onto)
        page = package_url(base, commit, variant)
        link = choose_wheel(_links(page), _arch(), page)
    print(f"vstack: vLLM {onto} is commit {commit[:12]}: {link.name}", file=sys.stderr)
    wheel, digest = _cached_or_download(project, link)
    from vstack.base import read_wheel_version

    _, reported = read_wheel_version(wheel)
    if reported and not commit.startswith(reported.removeprefix("g")):
        raise VstackError(
            f"{link.name} reports commit {reported}, but the index files it under "
            f"{commit[:12]}"
        )
    return PerCommitWheel(wheel, digest, commit, link.url)


def fetch_pinned(project: Project, pin: Pin) -> Path:
    """The pinned per-commit wheel, downloaded from `<index>/<commit>/` (a fresh
    clone's first build); later builds find it in the cache and need no network."""
    commit = pin.short_hash
    page = package_url(index_url(project), commit, project.wheel_variant)
    hits = [link for link in _links(page) if link.name == pin.wheel]
    if not hits:
        raise VstackError(f"{page} does not list the pinned {pin.wheel}")
    dest = project.wheel_cache / pin.wheel
    download(hits[0].url, dest, pin.sha256)
    return dest


def image_for(version: str, commit: str) -> str:
    """vLLM's image for a per-commit base: the release image for a release commit,
    else the nightly image of that commit."""
    if re.fullmatch(r"\d+\.\d+\.\d+", version):
        return f"vllm/vllm-openai:v{version}"
    return f"vllm/vllm-openai:nightly-{commit}"
