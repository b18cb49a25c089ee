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
# What git makes up from the user and host name when user.email is unset
# (ubuntu@ip-10-0-0-1.ec2.internal, me@laptop.local, root@box.(none)): a machine's
# name, where no mail is delivered, not a person's address. A name without a dot
# is left alone: git never guesses one (it appends ".(none)").
_HOST_TLDS = (".internal", ".local", ".lan", ".home", ".arpa", ".localnet")
_IP = re.compile(r"^(\[.*\]|\d{1,3}(\.\d{1,3}){3})$")
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
    # what the user typed, when git records it differently ("John Smith Jr.")
    given: str = dataclasses.field(default="", compare=False)

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


def _refusal(ident: Identity) -> tuple[str, str] | None:
    """(kind, why) when this identity cannot sign off: kind "bot" (a bot or tool)
    or "placeholder" (a placeholder, no-reply or shared name or address)."""
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
        return "bot", f"'{ident.name}' is a bot or tool, not a person"
    if name in _PLACEHOLDER_NAMES:
        return "placeholder", f"'{ident.name}' is a placeholder name"
    if not _GITHUB_USER_NOREPLY.match(ident.email) and (
        local in _NOBODY or any(w in domain for w in _NOBODY)
    ):
        return (
            "placeholder",
            f"<{ident.email}> is a no-reply or shared address, not a person's",
        )
    if local in _PLACEHOLDER_LOCALS or email in _PLACEHOLDER_EMAILS:
        return (
            "placeholder",
            f"<{ident.email}> is a placeholder or default address, not a person's",
        )
    if domain in _PLACEHOLDER_DOMAINS or domain.endswith(_PLACEHOLDER_TLDS):
        return "placeholder", f"<{ident.email}> is a placeholder address ({domain})"
    if domain.endswith(_HOST_TLDS) or _IP.match(domain) or "(none)" in domain:
        return (
            "placeholder",
            f"<{ident.email}> is a machine's address ({domain} is a host name, "
            f"not a mail domain: what git guesses when user.email is unset)",
        )
    return None


def refusal(ident: Identity) -> str | None:
    """Why this identity cannot sign off (a bot, a tool, a placeholder), or None."""
    found = _refusal(ident)
    return found[1] if found else None


def author_to_replace(ident: Identity | None) -> str | None:
    """Why a signer takes over this commit author, or None when the author is kept
    (a person) or may not be replaced (a bot or tool other than the stack's own:
    its authorship is real, and no person's sign-off can stand for it). Replaced:
    the stack's shared identity, and identities that name no person (placeholder,
    no-reply or shared names and addresses)."""
    if ident is None:
        return None
    if is_shared(ident):
        return "the stack's shared identity"
    found = _refusal(ident)
    if found and found[0] == "placeholder":
        return "a placeholder, not a person"
    return None


def is_shared(ident: Identity) -> bool:
    """The stack's own shared author (any spelling), which a sign-off replaces."""
    return re.sub(r"[^a-z0-9]+", "", ident.name.lower()) == "vllmeplbstack"


def as_git_writes(ident: Identity) -> Identity | None:
    """The identity as git records it in a commit (git itself normalises it:
    `git var GIT_AUTHOR_IDENT`, which strips leading and trailing "crud" such as
    ".", ",", ";", quotes and spaces, and drops "<" and ">" from a name), or None
    when git refuses it (a name of crud only)."""
    from vstack.gitutil import config_args, git_env, run

    p = run(
        ["git", *config_args(), "var", "GIT_AUTHOR_IDENT"], cwd=os.sep,
        capture_output=True, encoding="utf-8", errors="replace",
        env=git_env({"GIT_AUTHOR_NAME": ident.name, "GIT_AUTHOR_EMAIL": ident.email,
                     "GIT_AUTHOR_DATE": "1700000000 +0000"}),
    )  # fmt: skip
    line = p.stdout.strip()
    if p.returncode != 0 or not line:
        return None
    who = line.rsplit(" ", 2)[0]  # "<name> <<email>>" then the date git appends
    name, sep, email = who.rpartition(" <")
    if not sep or not email.endswith(">"):
        return None
    return Identity(name, email[:-1])


def checked(text: str, source: str) -> Identity:
    """The identity `text` names, as git writes it into a commit (so that the
    sign-off and the author git records are one identity), or one error saying
    why it cannot sign off."""
    ident = parse(text)
    if ident is None:
        raise VstackError(
            f'{source}: {text!r} is not an identity: give your own "Full Name '
            f'<address>" on one line, with one @'
        )
    normal = as_git_writes(ident)
    if normal is None or parse(str(normal)) is None:
        raise VstackError(
            f"{source}: git cannot record {ident} as an author (a name of "
            f'punctuation only?): give your own "Full Name <address>"'
        )
    ident = Identity(normal.name, normal.email, "" if normal == ident else str(ident))
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
