"""Robustness audits of a deployed classifier: D-Score, data mutation and metamorphic testing.

Each audit returns an :class:`~agent.audits.report.AuditResult`. The kinds are declared once, in
:mod:`agent.audits.registry` (built-ins in :mod:`agent.audits.kinds`); the audits themselves live in
``agent.audits.dscore``, ``agent.audits.mutation`` (packages) and ``agent.audits.metamorphic``.
"""

from agent.audits.report import AuditError, AuditResult, ProgressFn

__all__ = ["AuditError", "AuditResult", "ProgressFn"]
