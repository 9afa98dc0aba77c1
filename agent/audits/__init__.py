"""Robustness audits of a deployed classifier: D-Score, data mutation and metamorphic testing.

Each audit returns an :class:`~agent.audits.report.AuditResult`. The audit modules are imported
on demand (``agent.audits.dscore``, ``agent.audits.mutation``, ``agent.audits.metamorphic``).
"""

from agent.audits.report import AuditError, AuditResult, ProgressFn

__all__ = ["AuditError", "AuditResult", "ProgressFn"]
