"""Supervision: failure events, policies, the fault hook, and per-rank health at the owner."""
