"""Who signs off a PR: parsing "Name <email>" and refusing bots and placeholders.

The DCO sign-off certifies the Developer Certificate of Origin, which only a person
can do. The stack's patches are authored by a shared identity and carry no sign-off;
`vstack upstream --signoff` adds the submitter's when a draft is made ready to send.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from pathlib import Path

from vstack.errors import VstackError

ENV = "VSTACK_SIGNOFF"
_IDENT = re.compile(
    r"^\s*(?P<name>[^<>@]*[^<>@\s])\s*<(?P<email>[^<>\s@]+@[^<>\s@]+)>\s*$"
)
# GitHub's per-user private address (Settings > Emails) is a person's own address.
_GITHUB_USER_NOREPLY = re.compile(r"^\d+\+[A-Za-z0-9-]+@users\.noreply\.github\.com$")
# Only whole placeholders are refused: a real name or address may well contain
# "todo", "xx", "bot" or live at mail.com (Kenji Todo, xx@alibaba-inc.com, Jan Bot).
_PLACEHOLDER_DOMAINS = ("example.com", "example.org", "example.net", "localhost",
                        "localdomain", "domain", "yourdomain.com")  # fmt: skip
_PLACEHOLDER_TLDS = (".example", ".invalid", ".localhost", ".localdomain", ".test")
_NOBODY = ("noreply", "no-reply", "donotreply", "do-not-reply", "nobody")
# compared with every non-alphanumeric removed: "vLLM-EPLB-Stack", "vllm_eplb_stack"
_BOT_NAMES = (
    "vllmeplbstack",  # the stack's shared commit author
    "vstack",  # the identity vstack's own git calls commit with
    "githubactions",
    "dependabot",
    "renovate",
)
_BOT_EMAIL_LOCALS = ("eplbstack", "vstack")
_PLACEHOLDER_NAMES = (
    "todo", "fixme", "xxx", "tbd", "changeme", "your full name", "full name",
    "your name", "your real name", "real name", "first last", "firstname lastname",
    "first name last name",
)  # fmt: skip
# Addresses that are a template's or a default installation's, not a person's:
# vstack's own hint "<you@domain>", test@test.com, root@<host>.
_PLACEHOLDER_LOCALS = ("you", "your", "yourname", "your.name", "your-name", "your_name",
                       "email", "your.email", "youremail", "root", "todo", "fixme",
                       "xxx", "changeme")  # fmt: skip
_PLACEHOLDER_EMAILS = ("test@test.com",)
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]")


@dataclasses.dataclass(frozen=True)
class Identity:
    name: str
    email: str

    def __str__(self) -> str:
        return f"{self.name} <{self.email}>"

    def same_as(self, other: Identity) -> bool:
        """Equal as the DCO check compares a sign-off with the commit author."""
        return (
            self.name.casefold() == other.name.casefold()
            and self.email.casefold() == other.email.casefold()
        )


def parse(text: str) -> Identity | None:
    """ "Name <email>" with one @ and no newline or control character (a newline
    would let a name add trailer lines of its own to the message)."""
    if _CONTROL.search(text or ""):
        return None
    m = _IDENT.match(text or "")
    return Identity(m.group("name").strip(), m.group("email")) if m else None


def refusal(ident: Identity) -> str | None:
    """Why this identity cannot sign off (a bot, a tool, a placeholder), or None."""
    email = ident.email.lower()
    local, _, domain = email.partition("@")
    name = " ".join(ident.name.lower().split())
    squashed = re.sub(r"[^a-z0-9]+", "", name)
    if (
        squashed in _BOT_NAMES
        or name.endswith("[bot]")
        or local.endswith("[bot]")
        or re.sub(r"[^a-z0-9]+", "", local) in _BOT_EMAIL_LOCALS
    ):
        return f"'{ident.name}' is a bot or tool, not a person"
    if name in _PLACEHOLDER_NAMES:
        return f"'{ident.name}' is a placeholder name"
    if not _GITHUB_USER_NOREPLY.match(ident.email) and (
        local in _NOBODY or any(w in domain for w in _NOBODY)
    ):
        return f"<{ident.email}> is a no-reply or shared address, not a person's"
    if local in _PLACEHOLDER_LOCALS or email in _PLACEHOLDER_EMAILS:
        return f"<{ident.email}> is a placeholder or default address, not a person's"
    if domain in _PLACEHOLDER_DOMAINS or domain.endswith(_PLACEHOLDER_TLDS):
        return f"<{ident.email}> is a placeholder address ({domain})"
    return None


def is_shared(ident: Identity) -> bool:
    """The stack's own shared author (any spelling), which a sign-off replaces."""
    return re.sub(r"[^a-z0-9]+", "", ident.name.lower()) == "vllmeplbstack"


def checked(text: str, source: str) -> Identity:
    """The identity `text` names, or one error saying why it cannot sign off."""
    ident = parse(text)
    if ident is None:
        raise VstackError(
            f'{source}: {text!r} is not an identity: give your own "Full Name '
            f'<address>" on one line, with one @'
        )
    why = refusal(ident)
    if why:
        raise VstackError(
            f"{source}: refusing to sign off as {ident}: {why} (the DCO sign-off "
            f"is a person's own: give yours)"
        )
    return ident


def from_git_config(cwd: Path) -> str:
    """user.name and user.email, read explicitly from the user's git configuration
    (the only two keys read from it; every other git call runs without it)."""
    from vstack.gitutil import git_env

    values = []
    for key in ("user.name", "user.email"):
        p = subprocess.run(
            ["git", "config", "--get", key], cwd=cwd, capture_output=True,
            encoding="utf-8", errors="replace", env=git_env(user_config=True),
        )  # fmt: skip
        value = p.stdout.strip()
        if p.returncode != 0 or not value:
            raise VstackError(
                f'--signoff: git config has no {key}: give --signoff "Full Name '
                f'<you@domain>" or set {ENV}'
            )
        values.append(value)
    return f"{values[0]} <{values[1]}>"


def signer(option: str | None, root: Path) -> Identity | None:
    """Who signs off: `--signoff "Name <email>"`; a bare `--signoff` takes
    VSTACK_SIGNOFF, else the user's git user.name / user.email; without the
    option, VSTACK_SIGNOFF when set; else nobody (unsigned drafts)."""
    env = os.environ.get(ENV, "").strip()
    if option:
        return checked(option, "--signoff")
    if option == "":
        if env:
            return checked(env, ENV)
        return checked(from_git_config(root), "--signoff (from git config)")
    if env:
        return checked(env, ENV)
    return None
