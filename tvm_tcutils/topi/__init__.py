"""Computes and schedules as plain functions (no registration here)."""
