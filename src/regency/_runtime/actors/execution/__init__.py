"""Running actors: an instance's lifecycle and state, its executors, and the proc agent."""
