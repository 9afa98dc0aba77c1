"""The dataplane: one typed path from an inference request to its answer, for every transport (see
:mod:`agent.dataplane.plane`), with the modes behind it, the serving policy, the runtime holder and
observe mode's intake."""
