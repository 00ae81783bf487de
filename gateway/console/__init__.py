"""The operator console of the ledger (SPEC §7): server-rendered pages, htmx fragments, and
the actions of §5 as forms that call the very services the API calls.

Pages here: the triage queue, the effect page, the approvals inbox, the controls (freezes and
capabilities), login. The human queue is ``reconciliation.views`` and the saga pages are
``sagas.views``: each app owns its pages, and the project's ``gateway.urls`` composes them
under the one ``console:`` namespace. What those apps add to the ledger's pages (an open case,
a saga run, their buttons) they register in ``gateway.console.extensions``.

``base`` is the frame every page shares (``console_view``, ``ConsoleRequest``,
``render_polled``, ``perform``, ``error_response``).
"""
