"""Wiring: which compute and schedule for which op on which target, and the layout hooks."""
