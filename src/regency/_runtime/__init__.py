"""Internal runtime: the per-process router, mailboxes, actor executors, casting, host agent."""
