"""The host layer: the processes that run actors' procs.

The controller's boot, a proc's bootstrap, the zygote and launcher that start procs, the host
agent and the worker daemon. It sits on the actor and kernel layers; nothing below imports it.
"""
