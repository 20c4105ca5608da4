"""Env managers, token-exact conversations, the rollout scheduler and the pipeline loop."""
