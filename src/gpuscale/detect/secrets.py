"""Masking secrets before anything gpuscale prints leaves the machine (bug reports, CI logs).

Everything that prints environment values goes through here: `gpuscale env` and `gpuscale doctor`
(text and ``--json``, by way of `gpuscale.detect.env.relevant_environment`). The masked form keeps the name and shows
that a value was set, not what it is::

    >>> mask_secrets({"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123456789", "NCCL_DEBUG": "INFO"})
    {'HF_TOKEN': 'hf_*** (39 chars)', 'NCCL_DEBUG': 'INFO'}

Two rules, either is enough:

- the *name* looks secret: one of its words (split at ``_``, ``-``, ``.``) is a secret word (TOKEN,
  SECRET, KEY, PASSWORD, PASSWD, PWD, PASSPHRASE, CREDENTIAL(S), CREDS, AUTH, COOKIE, SESSION,
  PRIVATE, SALT, SIGNATURE), or ends in one of the longer ones (``HFTOKEN``, ``MYAPIKEY``). Whole
  words, so ``KEYBOARD``, ``MONKEY`` and ``TOKENIZERS_PARALLELISM`` stay readable; ``PWD`` and
  ``OLDPWD`` are directories, not passwords. Some masked values are harmless (SSH_AUTH_SOCK is a
  path, XDG_SESSION_ID a number): masking one too many is the cheap mistake;
- the *value* holds something shaped like a credential, whatever the variable is called: tokens
  of Hugging Face (``hf_``), GitHub (``ghp_``, ``github_pat_`` ...), GitLab (``glpat-``), Slack
  (``xoxb-`` ...), OpenAI/Anthropic-style keys (``sk-``), PyPI (``pypi-``), npm (``npm_``), AWS
  access key ids (``AKIA``/``ASIA``), JSON web tokens (``eyJ...``), PEM private keys, and the
  password in a URL (``https://user:PASSWORD@host``). Only the matching part is replaced, so
  ``https://user:***@proxy:3128`` still says which proxy.

The prefix shown is at most 3 characters and only for values of 12 characters or more, so a short
password shows nothing of itself; the length is always shown.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["is_secret_name", "mask_value", "mask_text", "mask_secret", "mask_secrets"]

_SECRET_WORDS = frozenset({
    "TOKEN", "TOKENS", "SECRET", "SECRETS", "KEY", "KEYS", "APIKEY", "PASSWORD", "PASSWORDS", "PASSWD", "PASS",
    "PWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "CREDS", "AUTH", "COOKIE", "COOKIES", "SESSION",
    "PRIVATE", "SALT", "SIGNATURE",
})
# Compound words (HFTOKEN, MYAPIKEY, DBPASSWORD) end in one of these; short ones (KEY, PASS) would
# catch MONKEY or COMPASS, so only these longer endings count inside a word.
_SECRET_ENDINGS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "ACCESSKEY", "SECRETKEY", "PRIVATEKEY",
                   "CREDENTIALS", "PASSPHRASE")
_NOT_SECRET = frozenset({"PWD", "OLDPWD"})  # the shell's working directories

_TOKEN_PATTERNS = re.compile(
    r"""
      \bhf_[A-Za-z0-9]{16,}                     # Hugging Face
    | \bgh[pousr]_[A-Za-z0-9]{20,}              # GitHub classic tokens
    | \bgithub_pat_[A-Za-z0-9_]{20,}            # GitHub fine-grained tokens
    | \bglpat-[A-Za-z0-9_-]{16,}                # GitLab
    | \bxox[abposr]-[A-Za-z0-9-]{10,}           # Slack
    | \bsk-[A-Za-z0-9_-]{20,}                   # OpenAI, Anthropic (sk-ant-...) and alike
    | \bpypi-[A-Za-z0-9_-]{20,}                 # PyPI
    | \bnpm_[A-Za-z0-9]{20,}                    # npm
    | \b(?:AKIA|ASIA)[A-Z0-9]{16}\b             # AWS access key ids
    | \beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*   # JSON web tokens
    | -----BEGIN[A-Z ]*PRIVATE\ KEY-----[\s\S]*?(?:-----END[A-Z ]*PRIVATE\ KEY-----|$)
    """,
    re.VERBOSE,
)
# scheme://user:password@host -> keep user and host, hide the password
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)(?P<password>[^@\s/]+)(?=@)")


def is_secret_name(name: str) -> bool:
    """True if the variable's name says it holds a secret (see the module docstring)."""
    upper = name.upper()
    if upper in _NOT_SECRET:
        return False
    words = [w for w in re.split(r"[^A-Z0-9]+", upper) if w]
    return any(w in _SECRET_WORDS or w.endswith(_SECRET_ENDINGS) for w in words)


def mask_value(value: str) -> str:
    """The masked form of a whole secret: ``hf_*** (37 chars)``; a short value shows no prefix."""
    if not value:
        return value  # set but empty: nothing to hide, and worth seeing
    prefix = value[:3] if len(value) >= 12 else ""
    return f"{prefix}*** ({len(value)} chars)"


def mask_text(text: str) -> str:
    """`text` with every credential-shaped part replaced (tokens, a URL's password); the rest kept."""
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + "***", text)
    return _TOKEN_PATTERNS.sub(lambda m: mask_value(m.group(0)), text)


def mask_secret(name: str, value: str) -> str:
    """The value of variable `name` as it may be printed: all of it masked if the name looks secret,
    else only the parts that look like credentials."""
    return mask_value(value) if is_secret_name(name) else mask_text(value)


def mask_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """A copy of `environ` that is safe to print: names kept, secret values masked. Pure."""
    return {name: mask_secret(name, value) for name, value in environ.items()}
