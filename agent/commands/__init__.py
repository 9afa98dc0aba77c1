"""Sub-commands of ``icos-agent``: each module has ``register(subparsers)`` and sets ``func``."""

#: Modules providing sub-commands, in the order ``--help`` lists them.
COMMAND_MODULES = (
    "agent.commands.fit",
    "agent.commands.check",
    "agent.commands.estimate_lake",
    "agent.commands.serve",
    "agent.commands.audit",
    "agent.commands.labels",
    "agent.commands.demo",
)
