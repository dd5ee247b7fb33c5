"""Seeing what the procs do: stacks, the admin API, the debugger and telemetry.

Built on the runtime's extension face, :mod:`regency._lowlevel`, like ``regency.rdma``. Its
public names: :func:`start_admin` (the mesh-admin HTTP API of this controller, as a job's
``enable_admin()`` starts it), :class:`AdminServer` and :func:`admin_token`. Stacks of a proc
mesh are ``ProcMesh.stacks()``. The admin server also serves the dashboard
(:mod:`regency.observe.dashboard`); ``regency top`` is :mod:`regency.observe.tui`; spans,
metrics and their recorder are :mod:`regency.observe.telemetry`'s.
"""

from regency._public import publish
from regency.observe.admin import AdminServer, admin_token, start_admin

__all__ = ["AdminServer", "admin_token", "start_admin"]

publish(__name__, globals())
