"""Secrets never reach what gpuscale prints: names that look secret, values that look like tokens, `gpuscale env`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpuscale.detect.env import relevant_environment
from gpuscale.detect.secrets import is_secret_name, mask_secret, mask_secrets, mask_text, mask_value

# Shaped like the real thing, valid nowhere.
TOKENS = {
    "hugging face": "hf_realLookingSecret123abcdefXYZ",
    "github classic": "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
    "github fine-grained": "github_pat_11ABCDEFG0abcdefghijkl_mnopqrstuvwxyz0123456789",
    "gitlab": "glpat-abcdefghij0123456789",
    "slack": "xoxb-123456789012-abcdefghijkl",
    "openai": "sk-proj-abcdefghijklmnopqrstuvwxyz012345",
    "anthropic": "sk-ant-api03-abcdefghijklmnopqrstuvwxyz",
    "pypi": "pypi-AgEIcHlwaS5vcmcCJDAwMDAwMDAw",
    "npm": "npm_abcdefghijklmnopqrstuvwxyz0123456789",
    "aws key id": "AKIAIOSFODNN7EXAMPLE",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
}


@pytest.mark.parametrize("name", [
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "GITHUB_TOKEN", "WANDB_API_KEY", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN", "DB_PASSWORD", "MYSQL_PWD", "PGPASSWORD", "SMTP_PASSWD", "GOOGLE_APPLICATION_CREDENTIALS",
    "NPM_CONFIG__AUTH", "SSH_AUTH_SOCK", "JUPYTER_COOKIE_SECRET", "SESSION_ID", "TLS_PRIVATE_KEY", "HFTOKEN",
    "MYAPIKEY", "hf_token", "Api-Key", "GPG_PASSPHRASE",
])
def test_secret_looking_names_are_secret(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", [
    "KEYBOARD", "XKB_DEFAULT_KEYMAP", "MONKEY_PATCH", "TOKENIZERS_PARALLELISM", "PWD", "OLDPWD", "PATH", "HOME",
    "COMPASS_DIR", "NCCL_SOCKET_IFNAME", "SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES", "PASSAGE", "AUTHOR", "SESSIONS_DIR_X",
])
def test_ordinary_names_are_not(name):
    # AUTHOR is not AUTH and PASSAGE not PASS: whole words only. SESSIONS_DIR_X: SESSIONS is not SESSION.
    assert not is_secret_name(name)


def test_masked_form_keeps_a_short_prefix_and_the_length_only():
    assert mask_value("hf_abcdefghijklmnopqrstuvwxyz0123456789") == "hf_*** (39 chars)"
    assert mask_value("hunter2") == "*** (7 chars)"  # a short password shows nothing of itself
    assert mask_value("") == ""  # set but empty: worth seeing, nothing to hide
    for value in ("abcdefghijklm", "x" * 200):
        masked = mask_value(value)
        assert value not in masked and value[3:] not in masked and f"({len(value)} chars)" in masked


@pytest.mark.parametrize("kind", sorted(TOKENS))
def test_token_shaped_values_are_masked_whatever_the_variable_is_called(kind):
    token = TOKENS[kind]
    for text in (token, f"Bearer {token}", f"--token={token} --verbose", f"a,{token},b"):
        masked = mask_secret("SOME_HARMLESS_NAME", text)
        assert token not in masked and token[4:] not in masked, (kind, masked)
        assert f"({len(token)} chars)" in masked
    assert mask_secret("ANYTHING", f"x {token} y").startswith("x ") and mask_secret("ANYTHING", f"x {token} y").endswith(" y")


def test_password_in_a_url_is_hidden_and_the_rest_kept():
    assert mask_text("http://alice:s3cr3t-pass@proxy.example.org:3128/") == "http://alice:***@proxy.example.org:3128/"
    assert mask_text("postgres://u:p%40ss@db/x") == "postgres://u:***@db/x"
    assert mask_text("https://pypi.org/simple") == "https://pypi.org/simple"  # no credentials: unchanged
    assert mask_text("node0:29500") == "node0:29500"


def test_private_key_blocks_are_masked():
    pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----"
    masked = mask_text(f"key: {pem}")
    assert "b3BlbnNzaC1rZXktdjEAAAAA" not in masked and masked.startswith("key: ")


def test_ordinary_values_pass_unchanged():
    environ = {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO", "MASTER_ADDR": "nid005001", "PATH": "/usr/bin:/bin",
               "HF_HOME": "/scratch/hf", "TOKENIZERS_PARALLELISM": "false", "GPUSCALE_GPU_CORES": "49-55;57-63",
               "SLURM_JOB_NODELIST": "nid[005001-005002]", "TASK": "sk-x", "HF_HUB_OFFLINE": "1"}
    assert mask_secrets(environ) == environ


def test_mask_secrets_keeps_every_name_and_returns_a_copy():
    environ = {"HF_TOKEN": TOKENS["hugging face"], "A": "1"}
    masked = mask_secrets(environ)
    assert list(masked) == ["HF_TOKEN", "A"] and masked["A"] == "1" and masked["HF_TOKEN"].startswith("hf_***")
    assert environ["HF_TOKEN"] == TOKENS["hugging face"]  # the input is not touched


def test_gpuscale_env_picks_the_variables_that_matter_and_masks_them():
    shown = relevant_environment({"HF_TOKEN": "hf_realLookingSecret123", "NCCL_DEBUG": "INFO", "HOME": "/root",
                                  "MY_PASSWORD": "x", "SLURM_JOB_ID": "12", "NCCL_IB_AUTH_KEY": "abcdef"})
    assert shown == {"HF_TOKEN": "hf_*** (23 chars)", "NCCL_DEBUG": "INFO", "NCCL_IB_AUTH_KEY": "*** (6 chars)",
                     "SLURM_JOB_ID": "12"}


def test_gpuscale_env_prints_no_secret_text_or_json(tmp_path):
    """The whole command, as a user runs it, with secrets of every kind in its environment."""
    secrets = {
        "HF_TOKEN": "hf_realLookingSecret123",  # a secret name, in a prefix `gpuscale env` lists
        "HUGGING_FACE_HUB_TOKEN": "hf_anotherLookingSecret456",
        "NCCL_IB_SECRET": "ncclSecretValue789",  # listed prefix, secret name, no token shape
        "HF_ENDPOINT": "https://hfuser:UrlPassword321@hub.example.org",  # listed, password in a URL
        "GPUSCALE_NOTE": TOKENS["github classic"],  # listed, innocent name, token-shaped value
        "TORCH_EXTRA": TOKENS["jwt"],
        "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",  # not listed at all
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    }
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("SLURM_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                                                        "TORCHELASTIC_RUN_ID", "GROUP_RANK")}
    env = {**base, **secrets, "PYTHONUNBUFFERED": "1"}
    hidden = [v for v in secrets.values()] + ["UrlPassword321", "realLookingSecret123", "ncclSecretValue789"]
    outputs = {}
    for args in ((), ("--json",)):
        result = subprocess.run([sys.executable, "-m", "gpuscale", "env", *args], env=env, cwd=tmp_path,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        for text in (result.stdout, result.stderr):
            for secret in hidden:
                assert secret not in text, f"gpuscale env {' '.join(args)} printed a secret: {secret[:4]}..."
        outputs[args] = result.stdout
    shown = json.loads(outputs[("--json",)])["environment"]
    assert shown["HF_TOKEN"] == "hf_*** (23 chars)"  # set, and its length, not its value
    assert shown["HF_ENDPOINT"] == "https://hfuser:***@hub.example.org"
    assert shown["NCCL_IB_SECRET"] == "ncc*** (18 chars)"
    assert "HF_TOKEN=hf_*** (23 chars)" in outputs[()]


def test_a_batch_script_holding_a_secret_from_env_is_readable_only_by_its_owner(tmp_path, capsys):
    from gpuscale.cli import main

    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    plain, secret = tmp_path / "plain.sh", tmp_path / "secret.sh"
    assert main(["slurm", "script", "--profile", "local", "--time", "10", "-o", str(plain), "--", str(script)]) == 0
    assert main(["slurm", "script", "--profile", "local", "--time", "10", "--env", "HF_TOKEN=hf_abcdefghijklmnop",
                 "-o", str(secret), "--", str(script)]) == 0
    assert plain.stat().st_mode & 0o777 == 0o755
    assert secret.stat().st_mode & 0o777 == 0o700
    assert "mode 0700" in capsys.readouterr().err
