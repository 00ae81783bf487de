"""``manage.py verify_audit [--tenant SLUG] [--no-seal] [--against CHECKPOINTS]``: report each
tenant's sealed head and sealing lag, seal what is committed (as the sequencer would), then
recompute every chain and report the first broken link; check each effect's status and each
receipt against the chain (gateway.checkpoints); with ``--against`` (a checkpoint file of JSON
lines, or JSON), prove the ledger extends every signed checkpoint in it. Exit status 1 when
anything is broken.

With ``--no-seal`` nothing is written: only the sealed part of each chain is verified, and the
unsealed events (protected by the database trigger alone until sealed) are counted.

The Merkle tree (gateway.audit_tree): ``--tree-head FILE`` (a saved signed head) with
``--inclusion FILE`` (an inclusion proof), ``--old-head FILE --consistency FILE`` (the proof that
the head extends an older one) and ``--witness-key B64`` (a witness cosignature of the head must
be among its ``cosignatures``), each checked against the gateway key (``--public-key``). With
``--url URL --token TOKEN`` the head and the proofs (``--event-id``, ``--old-head``) are fetched
from the API instead of files. ``--offline`` checks only these, without the database."""

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from gateway import audit_tree, checkpoints
from gateway.audit import seal_state, seal_tenant, verify_tenant
from gateway.lib import treehead, witness
from gateway.models import Tenant
from gateway.signing import approval_problems


def _load(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CommandError(f"cannot read {path}: {exc}") from None


def _fetch(options, path: str, params: dict[str, Any] | None = None) -> Any:
    try:
        return witness.call(options["url"], path, options.get("token") or "", params=params)
    except witness.Unreachable as exc:
        raise CommandError(f"cannot fetch {path}: {exc}") from None


def _tree_inputs(options) -> tuple[Any, Any, Any, Any]:
    """The head, the inclusion proof, the old head and the consistency proof (files or API)."""
    old = _load(options["old_head"]) if options.get("old_head") else None
    if not options.get("url"):
        head = _load(options["tree_head"]) if options.get("tree_head") else None
        inclusion = _load(options["inclusion"]) if options.get("inclusion") else None
        proof = _load(options["consistency"]) if options.get("consistency") else None
        return head, inclusion, old, proof
    head = _fetch(options, "tree-head")
    inclusion = proof = None
    if options.get("event_id") is not None:
        params = {"event_id": options["event_id"], "tree_size": head.get("tree_size")}
        inclusion = _fetch(options, "proof/inclusion", params)
    if old is not None:
        params = {"first": old.get("tree_size"), "second": head.get("tree_size")}
        proof = _fetch(options, "proof/consistency", params)
    return head, inclusion, old, proof


def tree_checks(options) -> tuple[list[str], int]:
    """Check the given tree head and proofs; the lines to print and how many failed."""
    head, inclusion, old, proof = _tree_inputs(options)
    if head is None:
        return [], 0
    key = options.get("public_key") or (None if options.get("offline") else "")
    if key is None:
        raise CommandError("--offline needs --public-key, the gateway's key (base64)")
    key = key or checkpoints.public_key_b64()
    checks: list[tuple[str, Any]] = [("tree head", lambda: treehead.check_head(head, key))]
    if inclusion is not None:
        checks.append(("inclusion", lambda: treehead.check_inclusion(head, inclusion, key)))
    if old is not None:
        if proof is None:
            raise CommandError("--old-head needs --consistency (or --url)")
        checks.append(("consistency", lambda: treehead.check_consistency(old, head, proof, key)))
    if options.get("witness_key"):
        checks.append(("witness", lambda: _cosigned(head, options["witness_key"])))
    lines, failed = [], 0
    for name, check in checks:
        try:
            check()
        except treehead.Invalid as exc:
            failed += 1
            lines.append(f"tree {name}: BROKEN: {exc}")
        else:
            lines.append(f"tree {name}: verified (size {head.get('tree_size')})")
    return lines, failed


def _cosigned(head: dict[str, Any], witness_key: str) -> None:
    problems = []
    for cosignature in head.get("cosignatures") or []:
        try:
            treehead.check_cosignature(head, cosignature, witness_key)
        except treehead.Invalid as exc:
            problems.append(str(exc))
        else:
            return
    raise treehead.Invalid(
        "no cosignature of the head by the witness key" + (f": {problems[0]}" if problems else "")
    )


class Command(BaseCommand):
    help = "Verify the audit hash chain of every tenant (or one), optionally against checkpoints."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", help="only this tenant's chain")
        parser.add_argument(
            "--no-seal", action="store_true", help="verify only what is sealed; write nothing"
        )
        parser.add_argument(
            "--against",
            metavar="CHECKPOINT",
            help="a signed checkpoint file (or JSON) the ledger must extend",
        )
        parser.add_argument(
            "--public-key",
            help="the trusted Ed25519 public key (base64); default: this deployment's",
        )
        parser.add_argument("--tree-head", metavar="FILE", help="a saved signed tree head")
        parser.add_argument("--inclusion", metavar="FILE", help="an inclusion proof")
        parser.add_argument("--old-head", metavar="FILE", help="an older signed tree head")
        parser.add_argument("--consistency", metavar="FILE", help="old head -> head proof")
        parser.add_argument("--witness-key", help="a witness key that must have cosigned")
        parser.add_argument("--url", help="fetch the head and proofs from this gateway")
        parser.add_argument("--token", help="the bearer token for --url")
        parser.add_argument("--event-id", type=int, help="with --url: prove this event")
        parser.add_argument(
            "--offline", action="store_true", help="check only the tree files, no database"
        )

    def handle(
        self,
        *args,
        tenant: str | None = None,
        no_seal: bool = False,
        against: str | None = None,
        **options,
    ):
        lines, failed = tree_checks(options)
        for line in lines:
            self.stdout.write(line)
        if options.get("offline"):
            if failed or not lines:
                raise CommandError(f"{failed} tree check(s) failed" if lines else "no tree head")
            return
        tenants = Tenant.objects.order_by("slug")
        if tenant:
            tenants = tenants.filter(slug=tenant)
            if not tenants.exists():
                raise CommandError(f"no tenant {tenant}")
        broken = 0
        for item in tenants:
            state = seal_state(item.pk)
            self.stdout.write(
                f"{item.slug}: sealed head at {state.length} ({state.last_hash[:12]}…"
                f"{', sealed ' + state.sealed_at.isoformat() if state.sealed_at else ''}); "
                f"{state.unsealed} unsealed, sealing lag {state.lag_seconds:.3f}s"
            )
            if state.halted:
                broken += 1
                self.stdout.write(
                    f"{item.slug}: BROKEN: the sequencer has stopped: PostgreSQL's transaction "
                    "ids are behind the chain's floor (restored into another cluster?); run "
                    "manage.py audit_rebase"
                )
            if not no_seal:
                while seal_tenant(item.pk):
                    pass
            found = verify_tenant(item.pk)
            if found is not None:
                broken += 1
                where = f"event {found.event_id}" if found.event_id else "the chain head"
                self.stdout.write(f"{item.slug}: BROKEN at {where}: {found.reason}")
                continue
            problems = checkpoints.status_problems(item.pk) + checkpoints.receipt_problems(item.pk)
            if problems:
                broken += 1
                for problem in problems[:20]:
                    self.stdout.write(f"{item.slug}: BROKEN: {problem}")
                continue
            self.stdout.write(f"{item.slug}: chain intact")
        if against:
            try:
                loaded = checkpoints.load(against)
            except (OSError, ValueError) as exc:
                raise CommandError(f"cannot read checkpoints from {against}: {exc}") from None
            for checkpoint in loaded:
                if tenant and checkpoint.get("tenant") != tenant:
                    continue
                verdict = checkpoints.checkpoint_verify(
                    checkpoint, trusted_key=options.get("public_key")
                )
                label = f"{verdict.tenant}: checkpoint at {verdict.length}"
                if verdict.ok:
                    self.stdout.write(f"{label}: extended")
                else:
                    broken += 1
                    self.stdout.write(f"{label}: BROKEN: {verdict.reason}")
        for item in tenants:
            # The tree's leaves, and each signed approval against its key (gateway.signing).
            for problem in [*audit_tree.leaf_problems(item.pk)[:20], *approval_problems(item.pk)]:
                broken += 1
                self.stdout.write(f"{item.slug}: BROKEN: {problem}")
        broken += failed
        if broken:
            raise CommandError(
                f"{broken} broken chain(s), checkpoint(s), tree check(s) or approval(s)"
            )
