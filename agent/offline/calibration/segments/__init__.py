"""The segments' fit-time room (of :mod:`agent.estimation.segments`): what segments are defined from
(:mod:`.data`), every kind's fit-time part (:mod:`.kinds`) and the bundle's segments with their reference on
the labeled validation data (:mod:`.fitting`)."""
