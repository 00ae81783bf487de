"""Development secrets under ``var/`` (the vault key, the audit signing seed) are made by
whichever process needs one first, and every process reads that same one
(gateway.lib.secretfile): two prefork children sealing their first receipts at once made one
of them fail with FileExistsError, its effect left DISPATCHING until its lease ran out."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

from gateway.lib import secretfile


def _race(path: str, barrier, results) -> None:
    barrier.wait()
    results.put(secretfile.read_or_create(Path(path), lambda: os.urandom(8).hex()))


def test_processes_that_start_together_agree_on_one_secret(tmp_path):
    path = tmp_path / "var" / "dev.key"
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(8), context.Queue()
    racers = [context.Process(target=_race, args=(str(path), barrier, results)) for _ in range(8)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(30)
    assert [racer.exitcode for racer in racers] == [0] * 8  # none raised
    secrets = {results.get(timeout=5) for _ in racers}
    assert len(secrets) == 1 and secrets == {path.read_text()}
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert os.listdir(path.parent) == ["dev.key"]  # no temporary file left behind


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


def _seed_race(barrier, results) -> None:
    from gateway import checkpoints
    from gateway.lib import vault

    barrier.wait()
    seed = checkpoints._development_seed()
    key = vault._development_key(checkpoints.settings.VAR_DIR / "vault.key")
    results.put((seed, key))


def test_the_audit_seed_and_the_vault_key_are_made_once_by_racing_processes(settings, tmp_path):
    from gateway.lib import vault

    settings.VAR_DIR = tmp_path / "fresh-var"
    vault._development_key.cache_clear()
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(8), context.Queue()
    racers = [context.Process(target=_seed_race, args=(barrier, results)) for _ in range(8)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(30)
    assert [racer.exitcode for racer in racers] == [0] * 8
    answers = {results.get(timeout=5) for _ in racers}
    assert len(answers) == 1
    ((seed, key),) = answers
    assert len(seed) == 32 and len(key) == 44
