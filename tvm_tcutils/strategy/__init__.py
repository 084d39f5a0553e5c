"""Wiring: which compute and schedule for which op and target, plus alter-op and legalize hooks."""
