"""The tensor engine's implementation; the public face is :mod:`regency.tensor`."""
