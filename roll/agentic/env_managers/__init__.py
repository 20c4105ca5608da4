"""Env managers: trajectory-wise (one row per episode) and step-wise (one row per turn)."""
