"""``manage.py audit_witness --url URL [--token TOKEN] [--dir DIR] [--once] [--interval N]
[--publish] [--gateway-key B64]``: witness one tenant's audit log (gateway.lib.witness).

The token (``--token`` or ``GATEWAY_WITNESS_TOKEN``) picks the tenant; an operator's token can
also publish the cosignatures back (``--publish``). The witness needs no database: run it on
another machine, under another account, with its own directory. Exit status 1, with both
sizes and roots, when the gateway's log no longer extends the last head it cosigned."""

import os
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from gateway.lib import treehead, witness


class Command(BaseCommand):
    help = "Cosign the gateway's audit tree heads after checking they extend the last one."

    def add_arguments(self, parser):
        parser.add_argument("--url", required=True, help="the gateway's base URL")
        parser.add_argument("--token", help="a bearer token of the tenant (or env)")
        parser.add_argument(
            "--dir", help="the witness's own directory (default GATEWAY_WITNESS_DIR)"
        )
        parser.add_argument("--gateway-key", help="the gateway's public key (base64)")
        parser.add_argument("--once", action="store_true", help="one round, then exit")
        parser.add_argument("--interval", type=float, default=60.0, help="seconds between rounds")
        parser.add_argument(
            "--publish", action="store_true", help="post each cosignature to the gateway"
        )

    def handle(self, *args, **options):
        token = options.get("token") or os.environ.get("GATEWAY_WITNESS_TOKEN", "")
        if not token:
            raise CommandError("a token is required: --token or GATEWAY_WITNESS_TOKEN")
        directory = Path(options.get("dir") or settings.GATEWAY_WITNESS_DIR)
        key = witness.witness_key(directory)
        self.stdout.write(
            f"witness key {treehead.fingerprint(treehead.public_b64(key))} in {directory}"
        )
        while True:
            self._round(options["url"], token, directory, options)
            if options["once"]:
                return
            time.sleep(max(options["interval"], 1.0))

    def _round(self, url: str, token: str, directory: Path, options) -> None:
        try:
            done = witness.witness_once(
                url, token, directory, gateway_key=options.get("gateway_key")
            )
        except treehead.Invalid as exc:
            raise CommandError(f"ALARM: {exc}") from None
        except witness.Unreachable as exc:
            if options["once"]:
                raise CommandError(f"the gateway did not answer: {exc}") from None
            self.stderr.write(f"the gateway did not answer: {exc}")
            return
        self.stdout.write(done.message)
        if options["publish"] and done.cosignature is not None:
            try:
                witness.call(
                    url,
                    "cosignatures",
                    token,
                    body={"head": done.head, "cosignature": done.cosignature},
                )
            except witness.Unreachable as exc:
                raise CommandError(f"the cosignature was not accepted: {exc}") from None
            self.stdout.write("published the cosignature")
