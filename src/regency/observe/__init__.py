"""Seeing what the procs do: logs, stacks, the debugger, the admin API and telemetry.

Internal (the public switches live on the mesh objects and the ``regency`` CLI, where Monarch has
them). Built on the runtime's extension face, :mod:`regency._lowlevel`, like ``regency.rdma``:
where the runtime must call into this package it does so through a hook this package registers.
"""
