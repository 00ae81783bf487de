"""Development secrets under ``var/`` (the vault key, the audit signing seed) are made by
whichever process needs one first, and every process reads that same one
(gateway.lib.secretfile): two prefork children sealing their first receipts at once made one
of them fail with FileExistsError, its effect left DISPATCHING until its lease ran out."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from django.conf import settings

from gateway.lib import secretfile

# Each racer is a process of its own, as gunicorn's and a prefork pool's are. It says it is
# ready, waits until all are, then asks for the secrets at once.
_RACER = """
import json, os, sys, time
var, racers, me = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.environ["GATEWAY_VAR_DIR"] = var
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
import django
django.setup()
from django.conf import settings
from gateway import checkpoints
from gateway.lib import vault
gate = os.path.join(os.path.dirname(var), "gate")
open(os.path.join(gate, me), "w").close()
deadline = time.monotonic() + 60
while len(os.listdir(gate)) < racers and time.monotonic() < deadline:
    pass
seed = checkpoints._development_seed().hex()
key = vault._development_key(settings.VAR_DIR / "vault.key")
print(json.dumps([seed, key]))
"""


def _race(tmp_path, racers: int = 6) -> list[list[str]]:
    var = tmp_path / "var"
    (tmp_path / "gate").mkdir()
    env = {key: value for key, value in os.environ.items() if key != "GATEWAY_VAR_DIR"}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(var), str(racers), str(n)],
            cwd=settings.BASE_DIR,
            env={**env, "PYTHONWARNINGS": "ignore"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(racers)
    ]
    answers = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-2000:]
        answers.append(json.loads(out.strip().splitlines()[-1]))
    return answers


def test_processes_that_start_together_make_one_seed_and_one_key(tmp_path):
    answers = _race(tmp_path)
    assert len({tuple(answer) for answer in answers}) == 1, answers
    seed, key = answers[0]
    assert len(bytes.fromhex(seed)) == 32 and len(key) == 44
    var = tmp_path / "var"
    assert sorted(os.listdir(var)) == ["audit_signing.key", "vault.key"]  # no temporary left
    assert oct((var / "vault.key").stat().st_mode & 0o777) == "0o600"


def test_a_process_that_loses_the_race_reads_the_winners_secret(tmp_path, monkeypatch):
    path = tmp_path / "dev.key"
    real_link = os.link

    def another_process_links_first(source, target):
        path.write_text("the winner's\n")
        return real_link(source, target)  # raises FileExistsError, as it would

    monkeypatch.setattr(secretfile.os, "link", another_process_links_first)
    assert secretfile.read_or_create(path, lambda: "mine") == "the winner's"
    assert os.listdir(tmp_path) == ["dev.key"]


def test_an_existing_secret_is_read_not_replaced(tmp_path):
    path = tmp_path / "dev.key"
    path.write_text("kept\n")
    assert secretfile.read_or_create(path, lambda: "new") == "kept"
    assert path.read_text() == "kept\n"
