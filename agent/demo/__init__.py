"""``icos-agent demo``: the whole story on the shipped MNIST CNN (see :mod:`agent.demo.story`).

Modules: :mod:`~agent.demo.traffic` (the phases of live traffic), :mod:`~agent.demo.agent_process`
(the agent in a subprocess), :mod:`~agent.demo.client` (V2 requests, estimates, audits),
:mod:`~agent.demo.fitting` (cached bundle), :mod:`~agent.demo.record` (what is recorded),
:mod:`~agent.demo.live` (the terminal view), :mod:`~agent.demo.report` (HTML and plots).
"""

from agent.demo.story import DemoOptions, run_demo

__all__ = ["DemoOptions", "run_demo"]
