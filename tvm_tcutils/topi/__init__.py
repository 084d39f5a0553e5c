"""TOPI computes and schedules as plain functions (no registration inside)."""
