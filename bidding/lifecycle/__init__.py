"""A task's life in the store: its states and the transitions allowed between them (pure), the
compare-and-set that applies a transition, and the message log that records each one."""
