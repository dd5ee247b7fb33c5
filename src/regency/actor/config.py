"""Monarch's ``monarch.actor.config``: settings of the Python side of actors.

``prefix_python_logs_with_actor`` (default ``True``): in Monarch, Python log records emitted
inside actors get an ``[actor=<...>] `` prefix. Regency accepts the setting; forwarding and
prefixing procs' logs is issue 13.
"""

from __future__ import annotations

prefix_python_logs_with_actor: bool = True
