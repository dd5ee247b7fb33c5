"""Monarch's ``monarch.builtins`` path for the remote functions that ship with regency.

The functions live in :mod:`regency.tensor.builtins`; ``regency.builtins.random`` and
``regency.builtins.log`` offer them under Monarch's module names, so a program's imports port
by changing ``monarch`` to ``regency``.
"""
