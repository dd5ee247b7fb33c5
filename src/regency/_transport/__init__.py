"""Internal transport layer: addresses, framing, authentication, connections, the I/O loop.

Nothing here knows about actors; the runtime (``regency._runtime``) builds on it.
"""
