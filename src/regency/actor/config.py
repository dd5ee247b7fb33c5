"""Monarch's ``monarch.actor.config``: settings of the Python side of actors.

``prefix_python_logs_with_actor`` (default ``True``): ``logging`` records logged inside an actor
get an ``[actor=<qualified name>] `` prefix before their message (``[actor=<root>] `` in the
controller's own code), whatever handler shows them. Assign ``False`` to turn it off in this
process; it is read at each record (each process has its own: set it in a proc's code to change
that proc).
"""

from __future__ import annotations

from regency._runtime.actors.observe.log_records import set_prefix_switch

prefix_python_logs_with_actor: bool = True


def _prefixing() -> bool:
    return prefix_python_logs_with_actor


set_prefix_switch(_prefixing)
