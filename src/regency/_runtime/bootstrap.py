"""Entry point of a spawned proc: ``python -m regency._runtime.bootstrap FD``.

The stable name a custom :class:`~regency.actor.BootstrapCommand` must end up running (as in
Monarch's docs); the work is in :mod:`regency._runtime.host.bootstrap`.
"""

from regency._runtime.host.bootstrap import main

if __name__ == "__main__":
    main()
