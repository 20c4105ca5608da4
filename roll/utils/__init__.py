"""Tracking, checkpoints, timing."""
