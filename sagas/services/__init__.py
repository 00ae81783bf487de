"""Every write of the sagas app: start, advance (the orchestrator), resume, cancel, freeze,
and the owners' tasks. One function per transition, each appending its saga event in the same
transaction (STYLE 4–8).

The orchestrator (``saga_advance``) is a function of what the ledger says: it reads the run's
step records and their effects' statuses and does the one next thing — issue the next step,
pause, start compensating, compensate the next step, or finish. It is told to look after every
status change of any of the run's effects (``sagas.listeners.advance_after_transition``, a
``gateway.hooks.after_transition`` listener, enqueues ``advance_saga`` on commit), and the
sweeper re-advances runs that went quiet, so a lost message delays a run but never strands it.

Concurrency: every write here takes the tenant's audit-chain head first, then the run's row
(``_lock``): the ledger's lock order (gateway.audit: chain head, then rows), so a saga write
and a ledger transition never wait for each other in opposite orders. Two orchestrators (a
redelivered message, the sweeper's copy, two workers) therefore run one after the other; the
second sees what the first issued. The unique index on (run, step, revision) is the backstop:
a step is never issued twice even if that lock were lost.

The package's modules, each one room of it: ``core`` (events, the state change, the lock),
``start``, ``orchestrator`` (and the sweeper), ``compensation``, ``actions`` (people's
actions). Every public name is re-exported here: callers import ``sagas.services`` as before.
"""

from sagas.services.actions import CancelResult as CancelResult
from sagas.services.actions import saga_cancel as saga_cancel
from sagas.services.actions import saga_freeze as saga_freeze
from sagas.services.actions import saga_resume as saga_resume
from sagas.services.actions import saga_task_close as saga_task_close
from sagas.services.actions import saga_unfreeze as saga_unfreeze
from sagas.services.compensation import CompensationDecision as CompensationDecision
from sagas.services.compensation import compensation_decision as compensation_decision
from sagas.services.core import DEFAULT_QUIET_AFTER as DEFAULT_QUIET_AFTER
from sagas.services.core import ORCHESTRATOR as ORCHESTRATOR
from sagas.services.core import SWEEPER as SWEEPER
from sagas.services.core import step_key as step_key
from sagas.services.orchestrator import saga_advance as saga_advance
from sagas.services.orchestrator import saga_sweep as saga_sweep
from sagas.services.start import SagaStart as SagaStart
from sagas.services.start import saga_start as saga_start
