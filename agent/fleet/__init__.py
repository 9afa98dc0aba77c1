"""``mode: fleet``: the estimates of all replicas of a model, from their exported window statistics."""
