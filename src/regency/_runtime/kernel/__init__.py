"""The per-process kernel: routing frames to mailboxes, port handlers and services; knows no actors.

The lowest runtime layer, over :mod:`regency._transport` and :mod:`regency.shape` only: the
router (:mod:`.router`; one :class:`~.proc_runtime.ProcRuntime` per process, held by
:mod:`.state`), mailboxes, pending replies, bulk payloads, the codec and wire tags, the
casting tree, ids and refs, services, gateways and blocking waits. Layers above reach it
through callbacks and small Protocols; the transport under it is injected through the send
seam (:mod:`.seam`), which the in-memory :mod:`.loopback` implements for unit tests.
"""
