"""Stage 2, search: build the solver's problem from a captured graph and the cost model (build) and solve it (solve/)."""
