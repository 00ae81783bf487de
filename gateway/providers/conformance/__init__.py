"""The provider conformance kit: one fault matrix run against an adapter and its server,
with the server's own records as the oracle (docs/guides/provider-conformance.md).

- ``matrix``: the cases, as data;
- ``drivers``: the server's side (its records, the faults it makes itself);
- ``proxy``: the fault proxy, for the faults a server cannot make;
- ``runner``: runs cases and reports each with its evidence;
- ``pytest_plugin``: the same, as a parametrised test in a team's own suite.

``manage.py provider_check <provider>`` runs it against a configured provider.
"""

from gateway.providers.conformance.drivers import Driver, RecordsDriver, SandboxDriver
from gateway.providers.conformance.matrix import (
    CASES,
    CASES_BY_NAME,
    NOT_FOR_MAIL,
    Case,
    Decision,
    Fault,
)
from gateway.providers.conformance.proxy import FaultProxy
from gateway.providers.conformance.runner import (
    FAIL,
    PASS,
    SKIP,
    CaseReport,
    Sample,
    Subject,
    format_table,
    run_case,
    run_matrix,
)

__all__ = [
    "CASES",
    "CASES_BY_NAME",
    "FAIL",
    "NOT_FOR_MAIL",
    "PASS",
    "SKIP",
    "Case",
    "CaseReport",
    "Decision",
    "Driver",
    "Fault",
    "FaultProxy",
    "RecordsDriver",
    "Sample",
    "SandboxDriver",
    "Subject",
    "format_table",
    "run_case",
    "run_matrix",
]
