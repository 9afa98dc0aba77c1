"""Soak test of the agent: bounded load (count and time) on loopback, mixing valid and invalid traffic."""
