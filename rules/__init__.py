"""The rule catalog: one module per rule, found by the engine at start-up."""
