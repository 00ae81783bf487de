"""Every write of reconciliation: lease recovery, the query-first reconciler, the human queue,
operators' resolutions and asynchronous receipts (STYLE 4–11).

The rule everything here follows: an uncertain effect is never sent again on a guess. The
provider is asked first, by the contract's lookup, outside any transaction; its answer is
written with a compare-and-set against what was read, in one short transaction that also
appends the event, the receipt and an immutable :class:`ReconciliationRecord`. Only a
provider's "no such operation" for a key it still remembers re-opens dispatch — with the
original key, so that even a wrong "not found" cannot make a second operation.

The package's modules, each one room of it: ``core`` (actors, the transaction shape, the
mismatch hook), ``cases`` (the human queue), ``leases`` (lease recovery), ``reconciler`` (the
lookups), ``resolution`` (operators' resolutions), ``closing`` (closing a case, recording a manual
fix), ``receipts`` (webhooks). Every name is
re-exported here: callers import ``reconciliation.services`` as before.
"""

from gateway.errors import ValidationProblem as ValidationProblem
from gateway.providers.base import LookupResult as LookupResult
from reconciliation.services.cases import case_acknowledge as case_acknowledge
from reconciliation.services.cases import case_open as case_open
from reconciliation.services.cases import cases_open_for_flagged as cases_open_for_flagged
from reconciliation.services.closing import case_close as case_close
from reconciliation.services.closing import effect_record_fix as effect_record_fix
from reconciliation.services.core import LEASE_RECOVERY as LEASE_RECOVERY
from reconciliation.services.core import POISON_DELAY as POISON_DELAY
from reconciliation.services.core import RECONCILER as RECONCILER
from reconciliation.services.core import on_mismatch as on_mismatch
from reconciliation.services.leases import (
    effects_recover_expired_leases as effects_recover_expired_leases,
)
from reconciliation.services.receipts import WebhookReceipt as WebhookReceipt
from reconciliation.services.receipts import webhook_receive as webhook_receive
from reconciliation.services.reconciler import Verdict as Verdict
from reconciliation.services.reconciler import _apply as _apply
from reconciliation.services.reconciler import effect_reconcile as effect_reconcile
from reconciliation.services.reconciler import reconcile_due as reconcile_due
from reconciliation.services.reconciler import reconcile_next_batch as reconcile_next_batch
from reconciliation.services.resolution import effect_resolve as effect_resolve
