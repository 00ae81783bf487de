"""The sandbox's data file: an append-only journal, replayed on start, compacted, crash-safe.

The sandbox's operation log is the exactly-once oracle, so a sandbox reopened from its file
must hold exactly what it held and answer exactly as it did. In process (the protocol
handlers themselves), with real files; no database.
"""

import builtins
import io
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from gateway.lib.digest import payload_digest
from gateway.providers.sandbox import SandboxProvider
from gateway.providers.sandbox import provider as provider_module
from gateway.providers.sandbox.provider import Reply


def command_body(n: int, *, amount: int = 100, version: int | None = None) -> bytes:
    resource: dict[str, Any] = {"type": "order", "id": f"ord_{n}"}
    if version is not None:
        resource["version"] = version
    data: dict[str, Any] = {
        "type": "billing.charge.create",
        "resource": resource,
        "payload": {"amount": amount, "currency": "EUR"},
    }
    data["payload_digest"] = payload_digest(**data)
    return json.dumps(data).encode()


def create(sandbox: SandboxProvider, key: str, n: int, **options: Any) -> Reply:
    return sandbox.handle_create(
        provider="billing", idempotency_key=key, body=command_body(n, **options)
    )


def state(sandbox: SandboxProvider) -> tuple[Any, ...]:
    return sandbox.operations(), sandbox.log(), sandbox.resources()


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def answers(sandbox: SandboxProvider, keys: list[str], ids: list[str]) -> list[Any]:
    """Requests whose answers do not depend on time or fresh ids, and what they answered."""
    replies = [create(sandbox, key, n) for n, key in enumerate(keys)]  # replays
    replies.append(create(sandbox, keys[0], 0, amount=999))  # the key with another body
    replies.append(create(sandbox, "new-key", 77, version=3))  # a stale version
    for op_id in ids * 2:  # twice: a processing operation moves on
        replies.append(sandbox.handle_lookup(provider="billing", operation_id=op_id))
    for key in [*keys, "never-sent"]:
        replies.append(sandbox.handle_lookup(provider="billing", idempotency_key=key))
    return [(r.status, r.body, r.headers) for r in replies]


def busy_sandbox(data_file: Path) -> SandboxProvider:
    """A sandbox whose file holds a reset, status changes and a processing operation."""
    sandbox = SandboxProvider(data_file=data_file)
    for n in range(5):
        create(sandbox, f"before-reset-{n}", n)
    sandbox.set_resource_version(provider=None, type="order", id="ord_1", version=1)
    sandbox.reset()
    sandbox.set_resource_version(provider="billing", type="order", id="ord_77", version=4)
    for n in range(6):
        create(sandbox, f"key-{n}", n)
    sandbox.add_fault("processing", lookups=1)
    create(sandbox, "settles", 6)  # processing, then succeeded
    sandbox.add_fault("processing", lookups=3)
    create(sandbox, "still-processing", 7)
    for key in ("settles", "settles", "still-processing"):
        sandbox.handle_lookup(provider="billing", idempotency_key=key)
    sandbox.add_fault("fail")
    create(sandbox, "failed", 8)
    return sandbox


def test_a_reopened_sandbox_holds_and_answers_exactly_what_it_did(tmp_path):
    first = busy_sandbox(tmp_path / "sandbox.json")
    first.close()
    second = SandboxProvider(data_file=tmp_path / "sandbox.json")

    assert state(second) == state(first)
    ops = first.operations()
    assert [o["idempotency_key"] for o in ops] == [
        *(f"key-{n}" for n in range(6)),
        "settles",
        "still-processing",
        "failed",
    ]
    assert [o["status"] for o in ops][-3:] == ["succeeded", "processing", "failed"]
    assert "before-reset" not in (tmp_path / "sandbox.json").read_text()  # reset rewrote it

    # The same requests get the same answers from both; the reopened one on a copy of the file.
    shutil.copy(tmp_path / "sandbox.json", tmp_path / "copy.json")
    copy = SandboxProvider(data_file=tmp_path / "copy.json")
    keys = [o["idempotency_key"] for o in ops]
    ids = [o["id"] for o in ops]
    assert answers(copy, keys, ids) == answers(first, keys, ids)
    assert copy.operations() == first.operations()
    strip = [{k: v for k, v in e.items() if k != "at"} for e in first.log()]
    assert [{k: v for k, v in e.items() if k != "at"} for e in copy.log()] == strip

    # And what the copy did after its reopening was persisted too.
    assert state(SandboxProvider(data_file=tmp_path / "copy.json")) == state(copy)


def test_each_change_is_one_appended_line(tmp_path):
    sandbox = SandboxProvider(data_file=tmp_path / "sandbox.json")
    sandbox.add_fault("processing", lookups=1)
    create(sandbox, "k", 1)
    op_id = sandbox.operations()[0]["id"]
    sandbox.handle_lookup(provider="billing", operation_id=op_id)
    sandbox.handle_lookup(provider="billing", operation_id=op_id)
    sandbox.handle_lookup(provider="billing", operation_id=op_id)  # succeeded: no change

    kinds = [(line["kind"], line.get("status")) for line in lines(tmp_path / "sandbox.json")]
    assert kinds == [
        ("header", None),
        ("operation", "processing"),
        ("log", 201),
        ("status", "processing"),
        ("log", 200),
        ("status", "succeeded"),
        ("log", 200),
        ("log", 200),
    ]


def test_compaction_keeps_everything_and_shrinks_the_file(tmp_path):
    data_file = tmp_path / "sandbox.json"
    sandbox = busy_sandbox(data_file)
    for version in range(200):
        sandbox.set_resource_version(provider=None, type="order", id="ord_9", version=version)
    before, size = state(sandbox), data_file.stat().st_size

    sandbox.compact()

    assert data_file.stat().st_size < size
    assert state(sandbox) == before
    assert state(SandboxProvider(data_file=data_file)) == before
    written = lines(data_file)
    assert [line["kind"] for line in written].count("status") == 0
    assert len(written) == 1 + len(before[0]) + len(before[1]) + len(before[2])
    assert [p.name for p in tmp_path.iterdir()] == ["sandbox.json"]  # no temp file left


def test_the_file_is_compacted_when_superseded_lines_outnumber_live_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(provider_module, "COMPACT_MIN_DEAD_LINES", 20)
    data_file = tmp_path / "sandbox.json"
    sandbox = SandboxProvider(data_file=data_file)
    create(sandbox, "k", 1)
    longest = 0
    for version in range(1, 300):
        sandbox.set_resource_version(provider=None, type="order", id="ord_9", version=version)
        longest = max(longest, len(lines(data_file)))

    live = 1 + 1 + 1 + 1  # header, operation, its log entry, the resource version
    assert longest <= live + max(live, 20) + 1
    assert state(SandboxProvider(data_file=data_file)) == state(sandbox)
    assert sandbox.resources()[0]["version"] == 299


def test_a_torn_last_line_is_ignored_with_a_warning(tmp_path, caplog):
    data_file = tmp_path / "sandbox.json"
    sandbox = busy_sandbox(data_file)
    sandbox.close()
    with data_file.open("a") as handle:  # a crash in the middle of an append
        handle.write('{"kind": "operation", "id": "op_torn", "status": "succ')

    with caplog.at_level(logging.WARNING, logger="gateway.providers.sandbox.journal"):
        reopened = SandboxProvider(data_file=data_file)

    assert state(reopened) == state(sandbox)
    assert "ignored a torn last line" in caplog.text
    assert data_file.read_text().endswith("}\n")  # truncated: the next append starts clean
    create(reopened, "after-the-crash", 20)
    again = SandboxProvider(data_file=data_file)
    assert state(again) == state(reopened)
    assert again.operations()[-1]["idempotency_key"] == "after-the-crash"


def test_a_complete_last_line_without_its_newline_is_kept(tmp_path):
    data_file = tmp_path / "sandbox.json"
    sandbox = SandboxProvider(data_file=data_file)
    create(sandbox, "k", 1)
    sandbox.close()
    data_file.write_text(data_file.read_text()[:-1])

    reopened = SandboxProvider(data_file=data_file)
    create(reopened, "k2", 2)

    assert [o["idempotency_key"] for o in reopened.operations()] == ["k", "k2"]
    assert state(SandboxProvider(data_file=data_file)) == state(reopened)


def test_a_broken_line_before_the_last_is_refused(tmp_path):
    data_file = tmp_path / "sandbox.json"
    sandbox = SandboxProvider(data_file=data_file)
    create(sandbox, "k", 1)
    sandbox.close()
    text = data_file.read_text().splitlines()
    text.insert(1, '{"kind": "operation", "id"')
    data_file.write_text("\n".join(text) + "\n")

    with pytest.raises(ValueError, match=r"sandbox\.json:2: not a JSON line"):
        SandboxProvider(data_file=data_file)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"format": 3}\n', "not a sandbox provider data file"),
        ('{"kind": "header", "format": 2}\n{"kind": "mystery"}\n', "unknown change kind"),
        ('{"kind": "header", "format": 2}\n{"kind": "status", "id": "op_x"}\n', "op_x"),
        ("notes, not a journal", "not a sandbox provider data file"),
        ("# notes\nnot a journal either", "sandbox.json:1: not a JSON line"),
        ('{"format": 1, "operations": []}\n{"torn', "not a sandbox provider data file"),
    ],
)
def test_a_file_that_is_not_a_journal_is_refused_untouched(tmp_path, content, message):
    data_file = tmp_path / "sandbox.json"
    data_file.write_text(content)
    with pytest.raises(ValueError, match=message):
        SandboxProvider(data_file=data_file)
    assert data_file.read_text() == content


def test_a_data_file_of_the_single_object_format_is_read_and_rewritten(tmp_path):
    source = busy_sandbox(tmp_path / "source.json")
    old = {
        "format": 1,
        "operations": [
            {k: v for k, v in line.items() if k != "kind"}
            for line in lines(tmp_path / "source.json")
            if line["kind"] == "operation"
        ],
        "log": source.log(),
        "resources": source.resources(),
    }
    data_file = tmp_path / "old.json"
    data_file.write_text(json.dumps(old))

    migrated = SandboxProvider(data_file=data_file)

    assert migrated.log() == source.log()
    assert migrated.resources() == source.resources()
    assert [o["id"] for o in migrated.operations()] == [o["id"] for o in source.operations()]
    assert lines(data_file)[0] == {"kind": "header", "format": 2}


def test_lookups_at_20000_operations_answer_from_memory(tmp_path, monkeypatch):
    data_file = tmp_path / "sandbox.json"
    first = SandboxProvider(data_file=data_file)
    body = command_body(1)
    for n in range(20_000):
        first.handle_create(provider="billing", idempotency_key=f"key-{n}", body=body)
    first.close()
    sandbox = SandboxProvider(data_file=data_file)
    assert len(sandbox.operations()) == 20_000
    by_key = {o["idempotency_key"]: o for o in first.operations()}

    opened: list[Any] = []
    for module, name in ((builtins, "open"), (io, "open"), (os, "open")):
        original = getattr(module, name)

        def spy(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            opened.append(args[0] if args else kwargs)
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    for n in range(0, 20_000, 97):
        key = f"key-{n}"
        reply = sandbox.handle_lookup(provider="billing", idempotency_key=key)
        assert (reply.status, reply.body["id"]) == (200, by_key[key]["id"])
        again = sandbox.handle_lookup(provider="billing", operation_id=by_key[key]["id"])
        assert again.body == reply.body
        assert sandbox.operations(idempotency_key=key) == [by_key[key]]
    miss = sandbox.handle_lookup(provider="billing", idempotency_key="key-20000")
    monkeypatch.undo()

    assert miss.status == 404
    assert opened == []  # every lookup answered from memory, its log line appended
    assert len(lines(data_file)) == 1 + 2 * 20_000 + 2 * 207 + 1
